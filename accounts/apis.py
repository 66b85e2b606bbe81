from __future__ import annotations

from rest_framework.response import Response

from accounts.selectors import api_key_list
from exchange.api.auth import Security
from exchange.api.views import GatewayApi


class ApiKeyListApi(GatewayApi):
    """The caller's API keys."""

    security = Security.USER_DATA
    ip_weight = 1
    uid_weight = 1
    response_example = [
        {
            "apiKey": "vmPUZE6mv9SD5VNHk4HlWFsOr6aKE2zvsw0MuIgwCIPy6utIco14y7Ju91duEh8A",
            "apiName": "trading bot",
            "apiType": ["Enable Spot", "Enable Convert"],
            "status": "ENABLE",
            "createTime": "1764000000000",
            "ipAccessRestrictions": ["203.0.113.7"],
        }
    ]

    def get(self, request):
        return Response(api_key_list(user=self.account))
