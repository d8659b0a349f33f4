"""SignalingHub: the signaling protocol's handler (docs/PROTOCOL.md). It admits sockets (room
code, join limits, group size, sockets per client), keeps each group's seats through connects,
drops, resumes, approvals and departures, and handles each message type with one method.
Built once per app (daisy.space.server.create_app) from a SignalingConfig."""
from __future__ import annotations

import asyncio
import collections
import hashlib
import hmac
import json
import logging
import secrets
import time

from fastapi import WebSocket

from daisy.space.addresses import address_key, client_ip, is_trusted, network_key, networks
from daisy.space.signaling.config import SignalingConfig
from daisy.space.signaling.connection import Close, Connection, Shared
from daisy.space.signaling.groups import (TOKEN, Group, Seat, join_request, members, peer_id_of, roster,
                                          viewers, vouchers)
from daisy.space.signaling.limits import ClientSockets, JoinLimiter, ReportRate
from daisy.space.signaling.messages import (CLOSE_BAD_ROOM, CLOSE_GROUP_FULL, CLOSE_IDLE, CLOSE_LEFT, CLOSE_REJECTED,
                                            CLOSE_REPLACED, CLOSE_ROOM_CLOSED, CLOSE_TOO_BIG,
                                            CLOSE_TOO_MANY_JOINS, DECODER, MAX_NAME, MAX_STATE, ROOM_CODE,
                                            NonFinite, clean_text, error, parse_vouch)

log = logging.getLogger("daisy.space.signaling")


class SignalingHub:
    """All signaling state of one app: groups[key].seats[peer_id] (rooms[key][peer_id])."""

    def __init__(self, config: SignalingConfig):
        self.config = config
        self.trusted = networks(config.trusted_proxies)
        self.groups: dict[str, Group] = {}
        self.by_token: dict[str, Seat] = {}
        self.peer_ids: set[str] = set()
        self.shared = Shared()
        self._clock_task: asyncio.Task | None = None
        self.joins = JoinLimiter(config.join_per_min, config.reject_cooldown_s)
        self.sockets = ClientSockets(config.max_conn_per_addr)

    # ---- what the app's HTTP routes ask ---------------------------------------------------

    def present(self, key: str, peer_id: str) -> bool:
        """Whether `peer_id` holds a connected seat in group `key` (one that left, or whose
        socket dropped, is gone: its group was told `peer-left`)."""
        group = self.groups.get(key)
        seat = group.seats.get(peer_id) if group else None
        return seat is not None and seat.conn is not None and not seat.released

    def vouchers(self, key: str, run: int, step: int, weight_hash: str, final: bool) -> tuple[frozenset, int]:
        """Who of group `key` vouched for that state of run `run`, and of how large a roster
        (groups.vouchers: reports over each reporter's own seat, docs/PROTOCOL.md "The stored run")."""
        group = self.groups.get(key)
        return vouchers(group, run, step, weight_hash, final) if group else (frozenset(), 0)

    def address_of(self, request) -> str:
        """The client address of an HTTP request (behind a trusted proxy: the client's), as a key."""
        return address_key(client_ip(request.headers, request.client.host if request.client else None,
                                     self.trusted))

    # ---- connection lifecycle -------------------------------------------------------------

    async def serve(self, ws: WebSocket) -> None:
        await ws.accept()  # accept first: a close before accept reaches the client as HTTP 403
        room = ws.query_params.get("room")
        if room is not None and not ROOM_CODE.fullmatch(room):
            await ws.close(CLOSE_BAD_ROOM, "room code must be 1-64 characters of A-Z a-z 0-9 _ -")
            return
        if self._clock_task is None or self._clock_task.done():
            self._clock_task = asyncio.create_task(self.shared.clock.run())
        ip = client_ip(ws.headers, ws.client.host if ws.client else None, self.trusted)
        addr = network_key(ip, self.config.ip_salt)
        # sockets per client: behind a trusted proxy, the client it names (a proxy itself,
        # with no client named, is exempt as in the raw connection guard: all behind it share it)
        client = None if is_trusted(ip, self.trusted) else address_key(ip)
        if client is not None and not self.sockets.admit(client):
            await ws.close(CLOSE_TOO_MANY_JOINS, f"too many connections from your address: "
                                                 f"{self.config.max_conn_per_addr} open at most")
            return
        try:
            await self._serve(ws, room, addr)
        finally:
            if client is not None:
                self.sockets.release(client)

    async def _serve(self, ws: WebSocket, room: str | None, addr: str) -> None:
        """An admitted socket: its seat (new or resumed) unless the join limits or the group's
        size refuse it, then its reader, writer and keep-alive until one of them ends."""
        key = "room:" + room.lower() if room is not None else addr  # codes: case-insensitive
        token = ws.query_params.get("token")
        resuming = (seat := self.by_token.get(token or "")) is not None and seat.group.key == key
        refusal = None
        if room is not None and not resuming:
            why = self.joins.refusal(addr, key, time.monotonic())
            if why:
                refusal = (CLOSE_TOO_MANY_JOINS, why)
        group = self.groups.get(key)
        if refusal is None and not resuming and group and len(group.seats) >= self.config.max_group:
            refusal = (CLOSE_GROUP_FULL, f"group full: {self.config.max_group} peers at most")
        if refusal:
            await ws.close(*refusal)
            return
        conn = Connection(ws, self.config, self.shared)
        seat = self._attach(conn, key, token, ws.query_params.get("name"), addr)
        reader = asyncio.create_task(self._read(seat, conn))
        writer = asyncio.create_task(self._write(conn))
        keepalive = asyncio.create_task(self._keepalive(conn))
        stuck = asyncio.create_task(conn.stuck.wait())
        try:
            await asyncio.wait({reader, writer, stuck}, return_when=asyncio.FIRST_COMPLETED)
            if conn.closing and not writer.done() and not stuck.done():
                await asyncio.wait({writer, stuck}, timeout=5)  # flush, then send the close
        finally:
            for task in (reader, writer, keepalive, stuck):
                task.cancel()
            if reader.done() and not reader.cancelled() and reader.exception():
                log.error("signaling: peer %s dropped by a server error", seat.id,
                          exc_info=reader.exception())
            conn.release_queue()
            self._detach(seat, conn)

    def _attach(self, conn: Connection, key: str, token: str | None, name: str | None, addr: str) -> Seat:
        seat = self.by_token.get(token or "")
        resumed = seat is not None and seat.group.key == key
        if resumed:
            if seat.expiry:
                seat.expiry.cancel()
                seat.expiry = None
            if seat.conn:  # the old socket is half-open or a second tab: the newest wins
                seat.conn.close(CLOSE_REPLACED, "resumed by a newer connection")
            if name:
                seat.name = clean_text(name, MAX_NAME) or seat.name
            seat.addr = addr
        else:
            group = self.groups.get(key)
            if group is None:
                public_id = hmac.new(self.config.ip_salt, key.encode(), hashlib.sha256)
                group = self.groups[key] = Group(key, public_id.hexdigest()[:12])
            if group.kind == "network":
                role = "member"
            else:
                role = "pending" if any(s.role == "host" for s in group.seats.values()) else "host"
            token, peer_id = self._identity(token, group)
            seat = Seat(peer_id, token, group, clean_text(name, MAX_NAME), role, addr,
                        collections.deque(maxlen=self.config.vouch_keep),
                        ReportRate(self.config.vouch_per_s, self.config.vouch_burst))
            group.seats[seat.id] = seat
            self.by_token[seat.token] = seat
        seat.conn = conn
        conn.send({"type": "welcome", "peerId": seat.id, "token": seat.token, "name": seat.name,
                   "group": {"kind": seat.group.kind, "id": seat.group.public_id},
                   "role": seat.role, "resumed": resumed, "iceServers": self.config.ice_servers,
                   "peers": roster(seat), "pingIntervalS": self.config.ping_s,
                   "maxFrame": self.config.max_frame})
        self._announce_arrival(seat)
        return seat

    def _identity(self, token: str | None, group: Group | None = None) -> tuple[str, str]:
        """(token, peer id) of a new seat. A well-formed token this hub does not know (minted
        by an earlier run of the server, or expired here) keeps its id, so a run's roster
        survives a restart; a malformed one, or one whose id a live seat holds (the same token
        in another group, or a preimage attempt), is ignored: a fresh identity. Why accepting
        client tokens gives nobody new power: docs/PROTOCOL.md "Identity"."""
        if token and TOKEN.fullmatch(token) and (peer_id := peer_id_of(token)) not in self.peer_ids \
                and not (group is not None and peer_id in group.removed):
            self.peer_ids.add(peer_id)
            return token, peer_id
        while (peer_id := peer_id_of(token := secrets.token_urlsafe(24))) in self.peer_ids:
            pass
        self.peer_ids.add(peer_id)
        return token, peer_id

    def _detach(self, seat: Seat, conn: Connection) -> None:
        if seat.conn is not conn:  # already replaced by a resumed connection
            return
        seat.conn = None
        if seat.released:
            return
        self._broadcast(viewers(seat), {"type": "peer-left", "peer": seat.id,
                                        "reason": "disconnected"})
        seat.expiry = asyncio.get_running_loop().call_later(
            self.config.grace_s, self._release, seat)

    def _release(self, seat: Seat) -> None:
        """Drop a seat for good (left, rejected, or its grace ran out); hand over the host role."""
        if seat.released:
            return
        seat.released = True
        for timer in (seat.expiry, seat.update_due):
            if timer:
                timer.cancel()
        group = seat.group
        del group.seats[seat.id]
        del self.by_token[seat.token]
        self.peer_ids.discard(seat.id)
        if group.kind == "room" and group.seats and \
                not any(s.admitted for s in group.seats.values()):
            self._close_room(group)
        elif not group.seats:
            del self.groups[group.key]
        elif seat.role == "host":
            self._hand_over(group)

    def _close_room(self, group: Group) -> None:
        """No approved member is left: only an approved member may ever become host, so the
        room ends; the peers still waiting are told, then closed (4410)."""
        for seat in list(group.seats.values()):
            seat.send({"type": "room-closed", "reason": "no approved member is left in the room"})
            if seat.conn:
                seat.conn.close(CLOSE_ROOM_CLOSED, "room closed: no approved member is left")
            seat.released = True
            for timer in (seat.expiry, seat.update_due):
                if timer:
                    timer.cancel()
            del self.by_token[seat.token]
            self.peer_ids.discard(seat.id)
        group.seats.clear()
        del self.groups[group.key]

    def _hand_over(self, group: Group) -> None:
        """New host: the longest-present approved member (connected ones first). Never a
        pending peer: with no approved member left the room closes (_close_room)."""
        seats = list(group.seats.values())
        ranked = [s for s in seats if s.admitted and s.conn] + [s for s in seats if s.admitted]
        host = ranked[0]
        host.role = "host"
        self._broadcast(members(group), {"type": "role", "peer": host.id, "role": "host"})
        self._broadcast(members(group), {"type": "peers", "peers": roster(host)})
        for seat in seats:
            if not seat.admitted and seat.conn:
                host.send(join_request(seat))

    # ---- socket tasks ---------------------------------------------------------------------

    async def _read(self, seat: Seat, conn: Connection) -> None:
        max_frame = self.config.max_frame
        while not conn.closing:
            frame = await conn.ws.receive()
            if frame["type"] == "websocket.disconnect":
                return
            conn.last_seen = time.monotonic()
            text, data = frame.get("text"), frame.get("bytes")
            size = len(data) if text is None else len(text)
            if size > max_frame or (text is not None and len(text.encode()) > max_frame):
                conn.close(CLOSE_TOO_BIG, f"frame over {max_frame} bytes")
                return
            if conn.admit():
                if text is None:
                    conn.send(error("bad-json", "binary frames are not accepted: send JSON text"))
                else:
                    self._handle(seat, conn, text)

    async def _write(self, conn: Connection) -> None:
        try:
            while True:
                item = await conn.outbox.get()
                if isinstance(item, Close):
                    await conn.ws.close(item.code, item.reason)
                    return
                conn.queued_bytes -= len(item)
                conn.shared.queued -= len(item)
                await conn.ws.send_text(item)
        except Exception:  # the client went away mid-send: the reader sees the disconnect
            return

    async def _keepalive(self, conn: Connection) -> None:
        ping = json.dumps({"type": "ping"})
        while not conn.closing:
            await asyncio.sleep(self.config.ping_s)
            silent = time.monotonic() - conn.last_seen
            if silent > self.config.idle_pings * self.config.ping_s:
                conn.close(CLOSE_IDLE, f"nothing received for {silent:.1f} s")
                return
            conn.send(ping)

    # ---- messages -------------------------------------------------------------------------

    def _handle(self, seat: Seat, conn: Connection, text: str) -> None:
        try:
            msg = DECODER.decode(text)
        except (json.JSONDecodeError, RecursionError) as err:
            conn.send(error("bad-json", f"not valid JSON: {err}"[:200]))
            return
        except NonFinite:
            conn.send(error("bad-json", "NaN, Infinity and -Infinity are not JSON; send numbers "
                                         "or strings"))
            return
        if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
            conn.send(error("bad-message", 'a message is a JSON object with a string "type"'))
            return
        kind, ref = msg["type"], msg.get("ref")
        if kind in ("signal", "relay"):
            self._forward(seat, msg, ref)
        elif kind in ("approve", "reject"):
            self._decide(seat, msg, ref)
        elif kind == "remove":
            self._remove(seat, msg, ref)
        elif kind == "hello":
            self._hello(seat, msg, ref)
        elif kind == "vouch":
            self._vouch(seat, msg, ref)
        elif kind == "ping":
            conn.send({"type": "pong"})
        elif kind == "pong":
            pass  # liveness is any frame; last_seen is already updated
        elif kind == "leave":
            self._broadcast(viewers(seat), {"type": "peer-left", "peer": seat.id,
                                            "reason": "left"})
            self._release(seat)
            conn.close(CLOSE_LEFT, "left")
        else:
            conn.send(error("unknown-type", f"unknown message type {kind[:40]!r}", ref))

    def _forward(self, seat: Seat, msg: dict, ref) -> None:
        to = msg.get("to")
        if not isinstance(to, str) or "data" not in msg:
            seat.send(error("bad-message", f'{msg["type"]} needs "to" (a peer id) and "data"', ref))
            return
        target = seat.group.seats.get(to)
        # One answer for "elsewhere", "nowhere", "pending" and "offline": ids can't be probed.
        if target is None or target is seat or not target.conn or not (
                target.admitted and seat.admitted):
            seat.send(error("no-such-peer", f"no peer {to[:40]!r} you can reach", ref))
            return
        target.send({"type": msg["type"], "from": seat.id, "data": msg["data"]})

    def _decide(self, seat: Seat, msg: dict, ref) -> None:
        if seat.role != "host":
            seat.send(error("not-host", f"only the room host can {msg['type']}", ref))
            return
        target = seat.group.seats.get(msg.get("peer") if isinstance(msg.get("peer"), str) else "")
        if target is None or target.admitted or not target.conn:
            seat.send(error("no-such-peer", "no pending peer with that id", ref))
            return
        if msg["type"] == "approve":
            target.role = "member"
            target.send({"type": "approved", "role": "member", "peers": roster(target)})
            self._announce_arrival(target)
        else:
            target.send({"type": "rejected", "reason": "the host declined the request to join"})
            target.conn.close(CLOSE_REJECTED, "rejected by the host")
            if target.addr:  # no reconnect-and-ask loop from that address
                self.joins.rejected(target.addr, seat.group.key, time.monotonic())
            self._release(target)

    def _remove(self, seat: Seat, msg: dict, ref) -> None:
        """The room host keeps a member out: its seat is released now (its token no longer
        resumes it, its id may not take a seat in this room again), it is told and closed 4403,
        its address waits the rejection cool-down before asking again, and the group is told
        `peer-left` with reason `removed` (docs/PROTOCOL.md "Client → server")."""
        if seat.role != "host":
            seat.send(error("not-host", "only the room host can remove a member", ref))
            return
        peer = msg.get("peer")
        target = seat.group.seats.get(peer) if isinstance(peer, str) else None
        if target is None or target is seat:
            seat.send(error("no-such-peer", "no other member with that id in your room", ref))
            return
        seat.group.removed.add(target.id)
        target.send({"type": "removed", "reason": "the room host removed this device"})
        if target.conn:
            target.conn.close(CLOSE_REJECTED, "removed by the host")
        if target.addr:
            self.joins.rejected(target.addr, seat.group.key, time.monotonic())
        self._broadcast(viewers(target), {"type": "peer-left", "peer": target.id, "reason": "removed"})
        self._release(target)

    def _hello(self, seat: Seat, msg: dict, ref) -> None:
        path = msg.get("path")
        if path not in (None, "gpu", "cpu") or not isinstance(msg.get("name", ""), str) or \
                not isinstance(msg.get("state", ""), str):
            seat.send(error("bad-message", 'hello: "name" and "state" are strings, "path" is '
                                            '"gpu" or "cpu"', ref))
            return
        if "name" in msg:
            seat.name = clean_text(msg["name"], MAX_NAME) or seat.name
        if path:
            seat.path = path
        if "state" in msg:
            seat.state = clean_text(msg["state"], MAX_STATE)
        # A pending peer's request stays the one outstanding request: its new name shows when
        # it is approved. An admitted peer's update goes out at most once per hello_min_s,
        # carrying the latest entry (a flood of hellos costs the group nothing more).
        if seat.admitted and seat.update_due is None:
            loop = asyncio.get_running_loop()
            wait = seat.updated_at + self.config.hello_min_s - loop.time()
            if wait <= 0:
                self._send_update(seat)
            else:
                seat.update_due = loop.call_later(wait, self._send_update, seat)

    def _vouch(self, seat: Seat, msg: dict, ref) -> None:
        """A member's report of its replica's weight hash at a step: kept (bounded) for the
        stored run's majority rule, never relayed; only an error answers."""
        if not seat.admitted:
            seat.send(error("not-admitted", "vouch: only an approved member's report counts", ref))
            return
        vouch = parse_vouch(msg, seat.id, self.config.max_group)
        if isinstance(vouch, str):
            seat.send(error("bad-message", vouch, ref))
            return
        if not seat.report_rate.admit(time.monotonic()):
            seat.send(error("rate-limited", f"vouch: over {self.config.vouch_per_s:g} reports/s; "
                                            "this one was not kept", ref))
            return
        seat.keep_report(vouch)

    def _send_update(self, seat: Seat) -> None:
        seat.update_due = None
        seat.updated_at = asyncio.get_running_loop().time()
        if seat.admitted and seat.conn and not seat.released:  # a delta, not the roster
            self._broadcast(members(seat.group), {"type": "peer-updated", "peer": seat.info()})

    # ---- telling the group ----------------------------------------------------------------

    def _announce_arrival(self, seat: Seat) -> None:
        if seat.admitted:
            message = {"type": "peer-joined", "peer": seat.info()}
        else:
            message = join_request(seat)
        self._broadcast(viewers(seat), message)
        if seat.role == "host":  # a host that (re)connects is owed the open requests
            for other in seat.group.seats.values():
                if not other.admitted and other.conn:
                    seat.send(join_request(other))

    @staticmethod
    def _broadcast(seats: list[Seat], message: dict) -> None:
        text = json.dumps(message)
        for seat in seats:
            seat.send(text)
