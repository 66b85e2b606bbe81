from django.urls import path

from accounts.apis import AccountInfoApi, ApiKeyListApi, CryptoAccountListApi, TransactionHistoryApi

urlpatterns = [
    path("v1/api-keys", ApiKeyListApi.as_view(), name="api-keys"),
    path("v1/account", AccountInfoApi.as_view(), name="account"),
    path("account/v3/crypto-accounts", CryptoAccountListApi.as_view(), name="crypto-accounts"),
    path("v1/asset/transaction/history", TransactionHistoryApi.as_view(), name="transaction-history"),
]
