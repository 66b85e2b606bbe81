"""General endpoints: ping, time, check-sys-status, user/ip."""

from __future__ import annotations

from rest_framework.response import Response

from exchange.api.auth import server_time_ms
from exchange.api.params import Param, ParamSpec
from exchange.api.views import GatewayApi
from exchange.models import BusinessType
from exchange.selectors import business_status_list


class PingApi(GatewayApi):
    """Test connectivity."""

    response_example: dict = {}

    def get(self, request):
        return Response({})


class ServerTimeApi(GatewayApi):
    """Server time in ms."""

    response_example = {"serverTime": 1764000000000}

    def get(self, request):
        return Response({"serverTime": server_time_ms()})


class SystemStatusApi(GatewayApi):
    """Business status of SPOT and CONVERT (operators switch them in the admin)."""

    ip_weight = 0
    uid_weight = 2
    params_spec = ParamSpec(
        (
            Param(
                "businessType",
                "ENUM",
                choices=tuple(BusinessType.values),
                description="SPOT or CONVERT; all when omitted.",
            ),
        )
    )
    response_example = [
        {"businessType": "SPOT", "businessStatus": "on"},
        {"businessType": "CONVERT", "businessStatus": "on"},
    ]

    def get(self, request):
        return Response(business_status_list(business_type=self.params["businessType"]))


class UserIpApi(GatewayApi):
    """The caller's IP address as the service sees it (the one API-key IP lists are checked against)."""

    response_example = {"ip": "203.0.113.7"}

    def get(self, request):
        return Response({"ip": request._request.client_ip})
