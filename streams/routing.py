from django.urls import path

from streams.consumers import UserDataConsumer

websocket_urlpatterns = [path("openapi/ws/<str:listen_key>", UserDataConsumer.as_asgi())]
