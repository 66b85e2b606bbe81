from __future__ import annotations

from rest_framework.response import Response

from exchange.api.auth import Security
from exchange.api.params import Param, ParamSpec
from exchange.api.views import GatewayApi
from streams import services

LISTEN_KEY = Param("listenKey", required=True, max_length=64, description="The key from POST.")


class UserDataStreamApi(GatewayApi):
    """Start (POST), keep alive (PUT) or close (DELETE) a user data stream. Any key may do this,
    read-only ones included: a stream only reads."""

    security = Security.USER_STREAM
    ip_weight = 1
    uid_weight = 1
    is_write = False
    http_method_names = ["post", "put", "delete"]
    params_spec = {"PUT": ParamSpec((LISTEN_KEY,)), "DELETE": ParamSpec((LISTEN_KEY,))}
    response_example = {"listenKey": "pqia91ma19a5s61cv6a81va65sdf19v8a65a1a5s61cv6a81va65sdf19v8a65a1"}

    def post(self, request):
        return Response({"listenKey": services.listen_key_start(account=self.account, api_key=self.api_key.key)})

    def put(self, request):
        services.listen_key_keepalive(account=self.account, key=self.params["listenKey"])
        return Response({})

    def delete(self, request):
        services.listen_key_close(account=self.account, key=self.params["listenKey"])
        return Response({})
