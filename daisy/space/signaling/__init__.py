"""WebSocket signaling: groups peers, gates rooms behind host approval, relays WebRTC signals.

The server never interprets what peers exchange: it assigns peer ids, decides who may talk to
whom (same group, nobody pending) and stamps the sender on everything it relays. The wire
protocol (messages, fields, close codes) is specified in docs/PROTOCOL.md.

One module per job, in data-flow order (importing any of them builds nothing and reads no
environment):
    config.py      SignalingConfig: every setting, and from_env (DAISY_*)
    messages.py    the wire's vocabulary: close codes, error messages, the JSON decoder, text rules
    limits.py      rate limits: the loop clock, each socket's token bucket, room joins per address,
                   sockets per client
    connection.py  one WebSocket: its outbox and token bucket
    groups.py      the group and room model: groups, seats, peer ids, who sees whom
    hub.py         SignalingHub: the protocol handler (admission, seats' lifecycle, messages)
    redaction.py   keeps tokens and room codes out of uvicorn's log lines
    routes.py      the routers (/signal, /api/room) and make_app
Client addresses and proxy trust: daisy/space/addresses.py.

Use: `hub = SignalingHub(SignalingConfig.from_env())` once per app (daisy.space.server.create_app),
then `app.include_router(make_signaling_router(hub))`.
"""
