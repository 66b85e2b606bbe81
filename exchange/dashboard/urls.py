"""Admin routes of the back office (included by exchange/urls.py before admin.site.urls)."""

from django.contrib import admin
from django.urls import path

from exchange.dashboard import views

app_name = "backoffice"

urlpatterns = [
    path("dashboard/", admin.site.admin_view(views.dashboard), name="dashboard"),
    path("customer/", admin.site.admin_view(views.customer), name="customer"),
    path("customer/<int:user_id>/", admin.site.admin_view(views.customer), name="customer_detail"),
]
