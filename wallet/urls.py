from django.urls import path

from wallet import apis
from wallet.transfers import apis as transfer_apis

urlpatterns = [
    path("wallet/v1/config/getall", apis.CoinListApi.as_view(), name="wallet-coins"),
    path("wallet/v1/deposit/address", apis.DepositAddressApi.as_view(), name="wallet-deposit-address"),
    path("wallet/v1/withdraw/apply", apis.WithdrawApplyApi.as_view(), name="wallet-withdraw-apply"),
    path("wallet/v1/deposit/history", apis.DepositHistoryApi.as_view(), name="wallet-deposit-history"),
    path("wallet/v1/withdraw/history", apis.WithdrawHistoryApi.as_view(), name="wallet-withdraw-history"),
    path("wallet/v1/withdraw/address-whitelist", apis.WhitelistApi.as_view(), name="wallet-whitelist"),
    path("transfer/v4/transfers", transfer_apis.TransferCreateApi.as_view(), name="transfer-create"),
    # One path, two endpoints: GET lists transfers, POST is the legacy creation.
    path("transfer/v3/transfers", transfer_apis.V3TransfersApi.as_view(), name="transfer-v3"),
    path("transfer/v3/transfers/<str:transfer_id>", transfer_apis.TransferQueryApi.as_view(), name="transfer-get"),
]
