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

# Issue 15, item 7 (IP restrictions of a sub-account's key) and item 8 (a sub-account's deposits).
urlpatterns += [
    path(
        "v1/sub-account/apikey/ip-restriction",
        apis.SubAccountIpRestrictionApi.as_view(),
        name="subaccount-ip-restriction",
    ),
    path(
        "v1/sub-account/apikey/add-ip-restriction",
        apis.SubAccountIpRestrictionAddApi.as_view(),
        name="subaccount-add-ip-restriction",
    ),
    path(
        "v1/sub-account/apikey/delete-ip-restriction",
        apis.SubAccountIpRestrictionDeleteApi.as_view(),
        name="subaccount-delete-ip-restriction",
    ),
    path(
        "v1/sub-account/wallet/deposit/address",
        apis.SubAccountDepositAddressApi.as_view(),
        name="subaccount-deposit-address",
    ),
    path(
        "v1/sub-account/wallet/deposit/history",
        apis.SubAccountDepositHistoryApi.as_view(),
        name="subaccount-deposit-history",
    ),
    path("v1/fund-collect/collect-from-sub-account", apis.FundCollectApi.as_view(), name="fund-collect"),
    path("v1/fund-collect/get-fund-record", apis.FundRecordApi.as_view(), name="fund-record"),
]
