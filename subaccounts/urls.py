from django.urls import path

from subaccounts import apis

urlpatterns = [
    path("v1/sub-account/list", apis.SubAccountListApi.as_view(), name="subaccount-list"),
    path("v1/sub-account/create", apis.SubAccountCreateApi.as_view(), name="subaccount-create"),
    path("v1/sub-account/asset", apis.SubAccountAssetApi.as_view(), name="subaccount-asset"),
    path(
        "v1/sub-account/transfer/universal-transfer",
        apis.UniversalTransferApi.as_view(),
        name="subaccount-universal-transfer",
    ),
    path("v1/sub-account/transfer/sub-to-master", apis.SubToMasterApi.as_view(), name="subaccount-sub-to-master"),
    path(
        "v1/sub-account/transfer/universal-transfer-history",
        apis.UniversalTransferHistoryApi.as_view(),
        name="subaccount-universal-transfer-history",
    ),
    path("v1/sub-account/transfer/sub-history", apis.SubTransferHistoryApi.as_view(), name="subaccount-sub-history"),
]
