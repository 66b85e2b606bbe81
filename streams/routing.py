"""Websocket routes. The user data stream consumer arrives with the streams issue."""

websocket_urlpatterns: list = []
