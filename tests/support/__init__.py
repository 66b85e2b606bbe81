"""What the tests share (tests/README.md): factories, the signed client, assertions, websocket
clients, admin staff and the full stack in subprocesses. Tests import from here, never from a
conftest module; the conftest files hold fixtures only."""
