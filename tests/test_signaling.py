"""Signaling server tests: real uvicorn on 127.0.0.1, real websockets clients (tests/signal_client.py).

One server for the module with fast timings; each test uses its own room codes and forwarded
IPs so tests never see each other's peers."""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import json
import socket

import httpx
import pytest

from daisy.space.addresses import network_key
from daisy.space.signaling import groups
from daisy.space.signaling.config import DEFAULT_ICE_SERVERS, SignalingConfig
from daisy.space.signaling.groups import TOKEN, peer_id_of
from daisy.space.signaling.hub import SignalingHub
from daisy.space.signaling.messages import (CLOSE_BAD_ROOM, CLOSE_IDLE, CLOSE_LEFT, CLOSE_POLICY, CLOSE_REJECTED,
                                            CLOSE_REPLACED, CLOSE_ROOM_CLOSED, CLOSE_TOO_BIG, CLOSE_TOO_MANY_JOINS)
from daisy.space.signaling.routes import make_app, make_signaling_router
from signal_client import Clients, SignalClient, async_test, serve_in_thread
from websockets.asyncio.client import connect

CONFIG = SignalingConfig(ping_s=0.2, grace_s=0.6, rate_per_s=50, rate_burst=100,
                         join_per_min=1e6, reject_cooldown_s=0.4, max_group=1000)  # one address


@pytest.fixture(scope="module")
def base():
    with serve_in_thread(make_app(SignalingHub(CONFIG))) as url:
        yield url





ROSTER_CHURN = ("peer-joined", "peer-left", "peer-updated", "peers")


async def relay_ok(sender: SignalClient, receiver: SignalClient, data="hi") -> None:
    """A relay gets through, stamped with the sender (roster news queued before it is skipped)."""
    await sender.send({"type": "relay", "to": receiver.id, "data": data})
    while (got := await receiver.next())["type"] in ROSTER_CHURN:
        pass
    assert got == {"type": "relay", "from": sender.id, "data": data}


async def room_with_members(c: Clients, room: str, n_members: int):
    """A host plus n_members approved members, in join order; everyone's inbox drained."""
    host = await c.open(room=room, name="host")
    assert host.welcome["role"] == "host"
    members = []
    for i in range(n_members):
        peer = await c.open(room=room, name=f"m{i}")
        assert peer.welcome["role"] == "pending"
        assert (await host.expect("join-request"))["peer"] == {"id": peer.id, "name": f"m{i}"}
        await host.send({"type": "approve", "peer": peer.id})
        approved = await peer.expect("approved")
        assert [p["id"] for p in approved["peers"]] == [host.id] + [m.id for m in members] + [peer.id]
        for other in [host] + members:
            assert (await other.expect("peer-joined"))["peer"]["id"] == peer.id
        members.append(peer)
    return host, members


async def room_with_pending(c: Clients, room: str, n_members: int):
    """room_with_members plus one more device whose join request the host has seen
    -> (host, members, pending)."""
    host, members = await room_with_members(c, room, n_members)
    pending = await c.open(room=room)
    assert (await host.expect("join-request"))["peer"]["id"] == pending.id
    return host, members, pending


# ---- grouping ------------------------------------------------------------------------------

@async_test
async def test_network_groups_by_the_address_the_proxy_added(base):
    async with Clients(base) as c:
        a = await c.open(xff="203.0.113.7", name="alice")
        # the client claimed 198.51.100.200; the (loopback, trusted) proxy appended the real one
        b = await c.open(xff="198.51.100.200, 203.0.113.7", name="bob")
        other = await c.open(xff="198.51.100.9")
        mapped = await c.open(xff="::ffff:203.0.113.7")
        assert a.welcome["group"]["kind"] == "network" and a.welcome["role"] == "member"
        assert a.welcome["group"]["id"] == b.welcome["group"]["id"] == mapped.welcome["group"]["id"]
        assert other.welcome["group"]["id"] != a.welcome["group"]["id"]
        assert [p["id"] for p in b.welcome["peers"]] == [a.id, b.id]
        assert [p["id"] for p in other.welcome["peers"]] == [other.id]
        for welcome in (a.welcome, b.welcome, other.welcome):
            assert "203.0.113" not in json.dumps(welcome) and "198.51" not in json.dumps(welcome)
        joined = await a.expect("peer-joined")
        assert joined["peer"]["id"] == b.id and joined["peer"]["name"] == "bob"
        assert (await a.expect("peer-joined"))["peer"]["id"] == mapped.id
        await relay_ok(a, b)
        await a.send({"type": "signal", "to": other.id, "data": {"sdp": "x"}})
        assert (await a.expect("error"))["code"] == "no-such-peer"
        await other.silent()


@async_test
async def test_ipv6_groups_by_64_prefix(base):
    async with Clients(base) as c:
        a, b, other = [await c.open(xff=x) for x in ("2001:db8:1:2::a", "[2001:db8:1:2::b]:443", "2001:db8:1:3::a")]
        assert a.welcome["group"]["id"] == b.welcome["group"]["id"] != other.welcome["group"]["id"]


@async_test
async def test_loopback_and_private_addresses_share_one_local_group(base):
    async with Clients(base) as c:
        peers = [await c.open()]  # the socket's own 127.0.0.1
        for xff in ("192.168.1.20", "10.0.0.5", "172.20.0.1", "169.254.1.1", "fd00::1",
                    "fe80::1", "::1", "not-an-ip"):  # unparsable: falls back to the socket's
            peers.append(await c.open(xff=xff))
        assert len({p.welcome["group"]["id"] for p in peers}) == 1
        assert [p["id"] for p in peers[-1].welcome["peers"]] == [p.id for p in peers]
        await relay_ok(peers[0], peers[5])


def test_network_key_is_salted_hash():
    ip = ipaddress.ip_address("203.0.113.7")
    assert network_key(ip, b"s1") == network_key(ip, b"s1") != network_key(ip, b"s2")
    assert "203" not in network_key(ip, b"s1")
    same_salt = [SignalingConfig.from_env({"DAISY_IP_SALT": "pepper"}) for _ in range(2)]
    assert network_key(ip, same_salt[0].ip_salt) == network_key(ip, same_salt[1].ip_salt)
    random_salts = [SignalingConfig.from_env({}) for _ in range(2)]
    assert network_key(ip, random_salts[0].ip_salt) != network_key(ip, random_salts[1].ip_salt)


# ---- rooms and approval --------------------------------------------------------------------

@async_test
async def test_room_pending_peer_is_isolated_until_approved(base):
    async with Clients(base) as c:
        host, (member,) = await room_with_members(c, "isolation", 1)
        assert host.welcome["group"]["kind"] == "room"
        pending = await c.open(room="ISOLATION", name="newcomer")  # codes are case-insensitive
        assert pending.welcome["role"] == "pending"
        assert pending.welcome["peers"] == [{"id": pending.id, "name": "newcomer", "role": "pending",
                                             "joinedAt": pending.welcome["peers"][0]["joinedAt"],
                                             "path": None, "state": ""}]
        assert (await host.expect("join-request"))["peer"] == {"id": pending.id, "name": "newcomer"}
        # Nothing flows either way while pending, and errors don't reveal who exists.
        for target in (host.id, member.id, "00000000"):
            await pending.send({"type": "signal", "to": target, "data": {"sdp": "offer"}})
            assert (await pending.expect("error"))["code"] == "no-such-peer"
        await member.send({"type": "relay", "to": pending.id, "data": "psst"})
        assert (await member.expect("error"))["code"] == "no-such-peer"
        # one outstanding request per connection: a pending hello is kept, not re-announced
        await pending.send({"type": "hello", "name": "renamed", "path": "cpu"})
        await member.send({"type": "hello", "state": "training"})  # goes to members only
        updated = await host.expect("peer-updated")
        assert updated["peer"]["id"] == member.id and updated["peer"]["state"] == "training"
        assert (await member.expect("peer-updated"))["peer"]["state"] == "training"
        await relay_ok(host, member)
        await pending.silent()
        await member.silent(0.05)
        # Approval: the newcomer gets the roster, members get peer-joined, relays work.
        await host.send({"type": "approve", "peer": pending.id})
        approved = await pending.expect("approved")
        assert approved["role"] == "member"
        assert [p["id"] for p in approved["peers"]] == [host.id, member.id, pending.id]
        for other in (host, member):
            joined = await other.expect("peer-joined")
            assert joined["peer"]["id"] == pending.id and joined["peer"]["path"] == "cpu"
            assert joined["peer"]["name"] == "renamed"
        await relay_ok(pending, member)
        await relay_ok(host, pending)


@async_test
async def test_rejection_is_final_for_that_connection(base):
    async with Clients(base) as c:
        host, (member,), pending = await room_with_pending(c, "reject-me", 1)
        await host.send({"type": "reject", "peer": pending.id})
        assert (await pending.expect("rejected"))["reason"]
        assert await pending.wait_closed() == (CLOSE_REJECTED, "rejected by the host")
        await member.silent(0.1)
        # Asking again at once from the same address: refused for the cool-down (4429).
        early = await SignalClient.open(base, room="reject-me", expect_welcome=False)
        assert (await early.wait_closed())[0] == CLOSE_TOO_MANY_JOINS
        await asyncio.sleep(CONFIG.reject_cooldown_s)
        # Its seat is gone: coming back is a new request (the id is its token's, so the same).
        again = await c.open(room="reject-me", token=pending.welcome["token"])
        assert again.id == pending.id and again.welcome["role"] == "pending"
        assert not again.welcome["resumed"]
        assert (await host.expect("join-request"))["peer"]["id"] == again.id
        await relay_ok(host, member)


@async_test
async def test_only_the_host_approves_or_rejects(base):
    async with Clients(base) as c:
        host, (member,), pending = await room_with_pending(c, "who-decides", 1)
        for actor in (member, pending):
            for verb in ("approve", "reject"):
                await actor.send({"type": verb, "peer": pending.id, "ref": 7})
                err = await actor.expect("error")
                assert err["code"] == "not-host" and err["ref"] == 7
        await host.send({"type": "approve", "peer": member.id})  # already a member
        assert (await host.expect("error"))["code"] == "no-such-peer"
        await host.send({"type": "approve", "peer": pending.id})
        assert (await pending.expect("approved"))["role"] == "member"


@async_test
async def test_the_host_removes_a_member_for_good(base):
    """`remove` (issue 27, property 6): host only; the member is told and closed 4403, the group
    is told peer-left "removed", its token resumes nothing, its id never takes a seat in the room
    again, and its address waits the cool-down before asking again."""
    async with Clients(base) as c:
        host, (member, liar) = await room_with_members(c, "remove-me", 2)
        for actor, target in ((member, liar), (liar, member)):
            await actor.send({"type": "remove", "peer": target.id, "ref": 3})
            err = await actor.expect("error")
            assert (err["code"], err["ref"]) == ("not-host", 3), err
        for peer in ("0123456789abcdef", host.id, 12, None):
            await host.send({"type": "remove", "peer": peer})
            assert (await host.expect("error"))["code"] == "no-such-peer"
        await host.send({"type": "remove", "peer": liar.id})
        assert (await liar.expect("removed"))["reason"]
        assert await liar.wait_closed() == (CLOSE_REJECTED, "removed by the host")
        for other in (host, member):
            assert await other.expect("peer-left") == {"type": "peer-left", "peer": liar.id, "reason": "removed"}
        await relay_ok(host, member)
        # back at once from its address: refused for the cool-down (4429)
        early = await SignalClient.open(base, room="remove-me", token=liar.welcome["token"], expect_welcome=False)
        assert (await early.wait_closed())[0] == CLOSE_TOO_MANY_JOINS
        await asyncio.sleep(CONFIG.reject_cooldown_s)
        # later its token gets a new identity, pending: the host decides again
        again = await c.open(room="remove-me", token=liar.welcome["token"])
        assert again.id != liar.id and again.welcome["role"] == "pending" and not again.welcome["resumed"]
        assert (await host.expect("join-request"))["peer"]["id"] == again.id
        await member.silent(0.1)


@async_test
async def test_host_leaving_hands_over_to_longest_present_member(base):
    async with Clients(base) as c:
        host, (first, second), pending = await room_with_pending(c, "handover", 2)
        await host.send({"type": "leave"})
        assert (await host.wait_closed())[0] == CLOSE_LEFT
        for m in (first, second):
            assert await m.expect("peer-left") == {"type": "peer-left", "peer": host.id,
                                                   "reason": "left"}
            assert await m.expect("role") == {"type": "role", "peer": first.id, "role": "host"}
            assert [p["role"] for p in (await m.expect("peers"))["peers"]] == ["host", "member"]
        assert (await first.expect("join-request"))["peer"]["id"] == pending.id
        await pending.silent(0.1)
        await second.send({"type": "approve", "peer": pending.id})
        assert (await second.expect("error"))["code"] == "not-host"
        await first.send({"type": "approve", "peer": pending.id})
        assert [p["id"] for p in (await pending.expect("approved"))["peers"]] == \
            [first.id, second.id, pending.id]


@async_test
async def test_with_no_approved_member_left_the_room_closes_and_pending_peers_are_told(base):
    """Only an approved member can ever become host (the finding: a never-approved peer became
    host once the members left)."""
    async with Clients(base) as c:
        host = await c.open(room="empty-room")
        first = await c.open(room="empty-room")
        dropper = await c.open(room="empty-room")
        second = await c.open(room="empty-room")
        assert [(await host.expect("join-request"))["peer"]["id"] for _ in range(3)] == \
            [first.id, dropper.id, second.id]
        await dropper.send({"type": "leave"})
        assert await host.expect("peer-left") == {"type": "peer-left", "peer": dropper.id,
                                                  "reason": "left"}
        await host.send({"type": "leave"})
        for waiting in (first, second):
            assert (await waiting.expect("room-closed"))["reason"]
            assert (await waiting.wait_closed())[0] == CLOSE_ROOM_CLOSED
        # the code is free again: the next one in starts a new room as its host
        fresh = await c.open(room="empty-room", token=first.welcome["token"])
        assert fresh.welcome["role"] == "host" and not fresh.welcome["resumed"]


@async_test
async def test_host_dropping_keeps_role_for_grace_then_hands_over(base):
    async with Clients(base) as c:
        host, (first,) = await room_with_members(c, "drop-host", 1)
        await host.close()
        assert await first.expect("peer-left") == {"type": "peer-left", "peer": host.id,
                                                   "reason": "disconnected"}
        await first.silent(CONFIG.grace_s / 2)  # seat held: the host may come back
        assert await first.expect("role") == {"type": "role", "peer": first.id, "role": "host"}
        late = await c.open(room="drop-host", token=host.welcome["token"])
        assert late.welcome["role"] == "pending" and not late.welcome["resumed"]  # a new seat


@async_test
async def test_reconnect_with_token_keeps_id_and_role(base):
    async with Clients(base) as c:
        host, (member,) = await room_with_members(c, "comeback", 1)
        await member.close()
        assert (await host.expect("peer-left"))["reason"] == "disconnected"
        back = await c.open(room="comeback", token=member.welcome["token"], name="m0-again")
        assert back.welcome["resumed"] and back.id == member.id
        assert back.welcome["role"] == "member" and back.welcome["token"] == member.welcome["token"]
        assert [p["id"] for p in back.welcome["peers"]] == [host.id, member.id]
        joined = await host.expect("peer-joined")
        assert joined["peer"]["id"] == member.id and joined["peer"]["name"] == "m0-again"
        await relay_ok(host, back)
        # The host too: same id, still host, and owed the open join requests.
        pending = await c.open(room="comeback")
        await host.expect("join-request")
        await host.close()
        await back.expect("peer-left")
        host2 = await c.open(room="comeback", token=host.welcome["token"])
        assert host2.id == host.id and host2.welcome["role"] == "host"
        assert (await host2.expect("join-request"))["peer"]["id"] == pending.id
        assert (await back.expect("peer-joined"))["peer"]["role"] == "host"
        # A second connection with the same token replaces the first (4409).
        twin = await c.open(room="comeback", token=host.welcome["token"])
        assert twin.id == host.id
        assert (await twin.expect("join-request"))["peer"]["id"] == pending.id
        assert (await host2.wait_closed())[0] == CLOSE_REPLACED
        await relay_ok(back, twin)
        # A token only resumes in its own group; elsewhere it is ignored.
        stranger = await c.open(room="elsewhere", token=member.welcome["token"])
        assert stranger.id != member.id and not stranger.welcome["resumed"]


@async_test
async def test_token_expires_after_grace(base):
    async with Clients(base) as c:
        a = await c.open(xff="203.0.113.40")
        b = await c.open(xff="203.0.113.40")
        await a.expect("peer-joined")
        await b.close()
        await a.expect("peer-left")
        await asyncio.sleep(CONFIG.grace_s + 0.3)
        again = await c.open(xff="203.0.113.40", token=b.welcome["token"])
        assert not again.welcome["resumed"]  # a new seat (with its token's id)


# ---- identity across a server restart (docs/PROTOCOL.md "Identity") ------------------------

@async_test
async def test_peer_id_is_a_function_of_the_token(base):
    async with Clients(base) as c:
        a = await c.open(xff="203.0.113.60")
        token = a.welcome["token"]
        assert TOKEN.fullmatch(token), token
        assert a.id == peer_id_of(token) == hashlib.sha256(token.encode()).hexdigest()[:16]


@async_test
async def test_a_restarted_server_gives_well_formed_tokens_their_ids_back():
    """A fresh hub (the server restarted: nothing in memory) seats a well-formed token it never
    issued under that token's id. Approvals were in memory: the first one back hosts the room,
    the others ask again."""
    with serve_in_thread(make_app(SignalingHub(CONFIG))) as url:
        async with Clients(url) as c:
            net = [await c.open(xff="203.0.113.61") for _ in range(2)]
            host, (member,) = await room_with_members(c, "restart-room", 1)
            before = {"net": [(p.id, p.welcome["token"]) for p in net],
                      "host": (host.id, host.welcome["token"]),
                      "member": (member.id, member.welcome["token"])}
    with serve_in_thread(make_app(SignalingHub(CONFIG))) as url:  # a new process's hub
        async with Clients(url) as c:
            back = [await c.open(xff="203.0.113.61", token=t) for _, t in before["net"]]
            assert [(p.id, p.welcome["token"]) for p in back] == before["net"]
            assert [p.welcome["resumed"] for p in back] == [False, False]  # new seats, old ids
            assert [p["id"] for p in back[1].welcome["peers"]] == [i for i, _ in before["net"]]
            assert (await back[0].expect("peer-joined"))["peer"]["id"] == back[1].id
            await relay_ok(back[0], back[1])
            member2 = await c.open(room="restart-room", token=before["member"][1])
            assert (member2.id, member2.welcome["role"]) == (before["member"][0], "host")
            host2 = await c.open(room="restart-room", token=before["host"][1])
            assert (host2.id, host2.welcome["role"]) == (before["host"][0], "pending")
            assert (await member2.expect("join-request"))["peer"]["id"] == host2.id
            await member2.send({"type": "approve", "peer": host2.id})
            assert [p["id"] for p in (await host2.expect("approved"))["peers"]] == \
                [member2.id, host2.id]
            await relay_ok(host2, member2)


@pytest.mark.parametrize("token", ["short", "a" * 31, "a" * 33, "é" * 32, "a" * 31 + "=",
                                   "a" * 31 + " ", "a" * 31 + "."])
@async_test
async def test_a_malformed_token_is_ignored_for_a_new_identity(base, token):
    async with Clients(base) as c:
        a = await c.open(xff="203.0.113.62", token=token)
        fresh = a.welcome["token"]
        assert fresh != token and TOKEN.fullmatch(fresh) and a.id == peer_id_of(fresh)
        assert not a.welcome["resumed"]


@async_test
async def test_a_token_whose_id_a_live_seat_holds_gets_a_new_identity(base, monkeypatch):
    async with Clients(base) as c:
        a = await c.open(xff="203.0.113.63")
        # the same token in another group while its seat is live: not a second seat with that id
        elsewhere = await c.open(xff="203.0.113.64", token=a.welcome["token"])
        assert elsewhere.id != a.id and elsewhere.welcome["token"] != a.welcome["token"]
        # another token with the same id (a preimage; feasible here with 3-hex-digit ids only)
        monkeypatch.setattr(groups, "PEER_ID_HEX", 3)
        b = await c.open(xff="203.0.113.65")
        twin = next(t for i in range(1 << 20) if (t := f"{i:032d}") != b.welcome["token"]
                    and peer_id_of(t) == b.id)
        thief = await c.open(xff="203.0.113.65", token=twin)
        assert thief.id != b.id and thief.welcome["token"] != twin
        assert [p["id"] for p in thief.welcome["peers"]] == [b.id, thief.id]
        await relay_ok(thief, b)


# ---- no enumeration ------------------------------------------------------------------------

@async_test
async def test_no_such_peer_answer_is_the_same_whether_or_not_the_peer_exists(base):
    async with Clients(base) as c:
        me, elsewhere = [await c.open(xff=x) for x in ("203.0.113.50", "203.0.113.51")]
        host, pending = [await c.open(room="enum-room") for _ in range(2)]
        answers = []
        for target in (elsewhere.id, host.id, pending.id, "f" * 16):
            await me.send({"type": "signal", "to": target, "data": 1})
            err = await me.expect("error")
            answers.append({**err, "message": err["message"].replace(target, "ID")})
        assert all(a == answers[0] for a in answers), answers
        assert answers[0]["code"] == "no-such-peer"
    router = make_signaling_router(SignalingHub(CONFIG))
    assert [r.path for r in router.routes] == ["/signal"]
    http_base = base.replace("ws://", "http://")
    for path in ("/rooms", "/peers", "/signal/rooms", "/groups"):
        assert httpx.get(http_base + path, timeout=5).status_code == 404


# ---- keep-alive ----------------------------------------------------------------------------

@async_test
async def test_ping_pong_keeps_alive_and_silence_closes(base):
    async with Clients(base) as c:
        live = await c.open(xff="203.0.113.60")
        mute = await c.open(xff="203.0.113.60", auto_pong=False)
        assert await mute.expect("ping", timeout=CONFIG.ping_s * 3) == {"type": "ping"}
        code, reason = await mute.wait_closed(timeout=CONFIG.ping_s * 6)
        assert code == CLOSE_IDLE and "nothing received" in reason
        await live.expect("peer-joined")
        assert (await live.expect("peer-left"))["peer"] == mute.id
        await live.send({"type": "ping"})
        assert await live.expect("pong") == {"type": "pong"}
        await asyncio.sleep(CONFIG.ping_s * 4)  # past the idle limit: pongs kept it open
        assert live.close_code is None
        assert live.welcome["pingIntervalS"] == CONFIG.ping_s


# ---- bad input -----------------------------------------------------------------------------

async def bystanders(c: Clients, xff: str):
    a = await c.open(xff=xff)
    b = await c.open(xff=xff)
    await a.expect("peer-joined")
    return a, b


@pytest.mark.parametrize("frame, code", [
    ("{not json", "bad-json"),
    (b"\x00\x01binary", "bad-json"),
    ("[1, 2]", "bad-message"),
    ('{"no": "type"}', "bad-message"),
    ('{"type": 5}', "bad-message"),
    ('{"type": "teleport", "ref": "r1"}', "unknown-type"),
    ('{"type": "signal", "data": {}}', "bad-message"),
    ('{"type": "relay", "to": "abc"}', "bad-message"),
    ('{"type": "hello", "path": "tpu"}', "bad-message"),
    ('{"type": "hello", "name": 12}', "bad-message"),
    ('{"type": "signal", "to": ["x"], "data": 1}', "bad-message"),
])
@async_test
async def test_bad_message_gets_error_and_connection_survives(base, frame, code):
    async with Clients(base) as c:
        a, b = await bystanders(c, "203.0.113.70")
        bad = await c.open(xff="203.0.113.70")
        await a.expect("peer-joined")
        await bad.send(frame)
        err = await bad.expect("error")
        assert err["code"] == code and err["message"]
        if code == "unknown-type":
            assert err["ref"] == "r1" and "teleport" in err["message"]
        await bad.send({"type": "ping"})
        assert (await bad.expect("pong"))["type"] == "pong"
        await relay_ok(a, b)
        await relay_ok(bad, a)


@async_test
async def test_frame_limit_is_64_kib_and_over_closes_1009(base):
    async with Clients(base) as c:
        a, b = await bystanders(c, "203.0.113.80")
        envelope = json.dumps({"type": "relay", "to": b.id, "data": ""})
        exact = {"type": "relay", "to": b.id, "data": "x" * (65536 - len(envelope))}
        assert len(json.dumps(exact)) == 65536
        await a.send(exact)
        assert len((await b.expect("relay"))["data"]) == 65536 - len(envelope)
        await a.send("é" * 40000)  # 40000 chars but 80000 bytes
        assert (await a.wait_closed())[0] == CLOSE_TOO_BIG
        assert (await b.expect("peer-left"))["peer"] == a.id
        c2 = await c.open(xff="203.0.113.80")
        await b.expect("peer-joined")
        await relay_ok(c2, b)


@async_test
async def test_flood_gets_rate_limited_then_closed_1008(base):
    async with Clients(base) as c:
        a, b = await bystanders(c, "203.0.113.90")
        # A short burst over the bucket: messages dropped with one error, socket kept.
        burst = await c.open(xff="203.0.113.91")
        for _ in range(150):
            await burst.send({"type": "ping"})
        replies = []
        with contextlib.suppress(AssertionError):
            while True:
                replies.append(await burst.next(timeout=0.3))
        errors = [r for r in replies if r["type"] == "error"]
        assert [e["code"] for e in errors] == ["rate-limited"] and "messages/s" in errors[0]["message"]
        assert 100 <= len(replies) - 1 < 150 and all(r["type"] == "pong" for r in replies if r not in errors)
        await burst.send({"type": "ping"})
        assert (await burst.expect("pong"))["type"] == "pong" and burst.close_code is None
        # A sustained flood: closed with 1008.
        flood = await c.open(xff="203.0.113.90")
        await a.expect("peer-joined")
        errors = []
        with contextlib.suppress(Exception):
            for _ in range(2000):
                await flood.send({"type": "relay", "to": a.id, "data": "spam"})
        code, reason = await flood.wait_closed()
        assert code == CLOSE_POLICY and "rate" in reason
        while not flood.inbox.empty():
            msg = flood.inbox.get_nowait()
            if msg["type"] == "error":
                errors.append(msg["code"])
        assert errors == ["rate-limited"]
        # a got at most a burst of spam, then learns the flooder left; b is unaffected.
        spam = 0
        while (msg := await a.next())["type"] == "relay":
            spam += 1
        assert msg == {"type": "peer-left", "peer": flood.id, "reason": "disconnected"}
        assert 100 <= spam < 200
        await relay_ok(a, b)
        await relay_ok(b, a)


@async_test
async def test_peer_that_stops_reading_is_dropped_1013():
    """A stuck reader must not grow server memory: past outbox_max_bytes it is cut off."""
    config = SignalingConfig(ping_s=5, grace_s=0.5, rate_burst=1000, outbox_max_bytes=1 << 20)
    with serve_in_thread(make_app(SignalingHub(config))) as url:
        async with Clients(url) as c:
            sender = await c.open(xff="203.0.113.110")
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", int(url.rsplit(":", 1)[1])))
            stuck = await connect(f"{url}/signal", sock=sock, max_queue=1, compression=None,
                                  additional_headers={"X-Forwarded-For": "203.0.113.110"})
            stuck_id = json.loads(await stuck.recv())["peerId"]  # then never reads again
            await sender.expect("peer-joined")
            blob = "x" * 60000
            for _ in range(300):  # 18 MB: more than the socket buffers can hide
                await sender.send({"type": "relay", "to": stuck_id, "data": blob})
                if not sender.inbox.empty():
                    break
            assert await sender.expect("peer-left", timeout=4) == {  # no 5 s close wait
                "type": "peer-left", "peer": stuck_id, "reason": "disconnected"}
            await sender.send({"type": "ping"})
            while (msg := await sender.next())["type"] != "pong":  # relays sent after the drop
                assert msg["code"] == "no-such-peer", msg
            stuck.transport.abort()


@pytest.mark.parametrize("room", ["a" * 65, "", "a b", "héllo", "../x", "room!", "x;y"])
@async_test
async def test_bad_room_code_closes_4400(base, room):
    async with Clients(base) as c:
        a, b = await bystanders(c, "203.0.113.100")
        bad = await SignalClient.open(base, room=room, expect_welcome=False)
        code, reason = await bad.wait_closed()
        assert code == CLOSE_BAD_ROOM and "room code" in reason
        assert bad.inbox.empty()
        await relay_ok(a, b)


@async_test
async def test_longest_room_code_is_accepted(base):
    async with Clients(base) as c:
        longest = await c.open(room="Z" * 64)
        assert longest.welcome["role"] == "host" and longest.welcome["group"]["kind"] == "room"


# ---- ICE configuration ---------------------------------------------------------------------

def test_ice_servers_from_env():
    assert SignalingConfig.from_env({}).ice_servers == DEFAULT_ICE_SERVERS
    env = {"DAISY_ICE_SERVERS": '[{"urls": ["stun:a.example:3478", "stun:b.example:3478"]}]',
           "DAISY_TURN_URL": "turn:t.example:3478", "DAISY_TURN_USER": "u",
           "DAISY_TURN_PASS": "p"}
    assert SignalingConfig.from_env(env).ice_servers == [
        {"urls": ["stun:a.example:3478", "stun:b.example:3478"]},
        {"urls": "turn:t.example:3478", "username": "u", "credential": "p"}]
    for bad in ('{"urls": "stun:x"}', "[not json", '[{"url": "stun:x"}]'):
        with pytest.raises(ValueError, match="DAISY_ICE_SERVERS"):
            SignalingConfig.from_env({"DAISY_ICE_SERVERS": bad})
    with pytest.raises(ValueError, match="DAISY_PING_S"):
        SignalingConfig.from_env({"DAISY_PING_S": "soon"})
    cfg = SignalingConfig.from_env({"DAISY_PING_S": "5", "DAISY_RECONNECT_GRACE_S": "7",
                                    "DAISY_RATE_PER_S": "10", "DAISY_RATE_BURST": "20"})
    assert (cfg.ping_s, cfg.grace_s, cfg.rate_per_s, cfg.rate_burst) == (5, 7, 10, 20)


@async_test
async def test_welcome_pushes_configured_ice_servers():
    servers = [{"urls": "turn:t.example:3478", "username": "u", "credential": "p"}]
    with serve_in_thread(make_app(SignalingHub(SignalingConfig(ice_servers=servers)))) as url:
        client = await SignalClient.open(url)
        assert client.welcome["iceServers"] == servers
        await client.close()


def test_importing_the_signaling_modules_builds_nothing():
    """Importing reads no environment and touches no logger: a bad DAISY_* value only fails
    when an app is built, and uvicorn's loggers get the redaction from the app builders."""
    import subprocess
    import sys
    from pathlib import Path
    code = ("import logging, daisy.space.signaling.routes, daisy.space.group_run\n"
            "assert not any(logging.getLogger(n).filters for n in ('uvicorn.access', 'uvicorn.error'))\n"
            "from daisy.space.signaling.routes import make_app\n"
            "try:\n    make_app()\nexcept ValueError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={"PATH": "", "DAISY_PING_S": "soon"}, cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0 and "DAISY_PING_S" in out.stdout, out.stdout + out.stderr
