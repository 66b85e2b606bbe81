"""Convert admin: asset prices (one per asset, in the numeraire, with their last confirmation time),
markets (spreads; their prices are derived) and pairs are edited; quotes and orders are read-only;
the house's liquidity per asset, topped up through an audited posting."""

from __future__ import annotations

import uuid

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path
from django.utils import timezone

from accounts import ledger
from accounts.models import Asset, SystemRole
from convert import controls, prices, selectors, services
from convert.models import AssetPrice, Market, Order, Pair, Quote
from exchange.backoffice.toolkit import GuardedChangeAdmin, ReadOnlyAdmin, ReasonActionForm, submit_to_each


class TopUpForm(forms.Form):
    asset = forms.ModelChoiceField(queryset=Asset.objects.all())
    amount = forms.DecimalField(max_digits=36, decimal_places=18, min_value=0)
    reason = forms.CharField(max_length=200, help_text="Recorded on the posting with your name.")
    request_id = forms.CharField(widget=forms.HiddenInput)  # a double submit posts once

    def clean_amount(self):
        amount = self.cleaned_data["amount"]
        if amount <= 0:
            raise forms.ValidationError("A top-up must be positive.")
        return amount


@admin.register(AssetPrice)
class AssetPriceAdmin(GuardedChangeAdmin, admin.ModelAdmin):
    """One price per asset in the numeraire (CONVERT_NUMERAIRE). Setting the anchor moves the price
    there at once; the price source then walks it around. Every change needs a reason (audited); an
    anchor moved, by anyone alone, more than 1% from its reference within 24 h waits for a second
    Administrator (convert/controls.py)."""

    list_display = ("__str__", "anchor_price", "price", "price_updated_at", "walk_step_bps", "walk_band_bps")
    list_select_related = ("asset",)
    fields = (
        "asset",
        "anchor_price",
        "walk_step_bps",
        "walk_band_bps",
        "reason",
        "price",
        "price_updated_at",
        "moved_alone",
    )
    readonly_fields = ("price", "price_updated_at", "moved_alone")

    @admin.display(description="anchor moved alone (24 h)")
    def moved_alone(self, obj: AssetPrice) -> str:
        if obj is None or obj.pk is None:
            return "-"
        budget = controls.anchor_budget(obj)
        if not budget.readable:
            return "history unreadable: every move waits for a second Administrator"
        return (
            f"{budget.moved_alone.normalize():f} of {budget.limit.normalize():f} from the reference "
            f"{budget.reference.normalize():f}; a move beyond that waits for a second Administrator"
        )

    def save_model(self, request, obj, form, change):
        if not change:  # a new asset's price starts at its anchor, confirmed now
            form.cleaned_data["price"] = form.cleaned_data["anchor_price"]
            form.cleaned_data["price_updated_at"] = timezone.now()
        super().save_model(request, obj, form, change)


@admin.register(Market)
class MarketAdmin(GuardedChangeAdmin, admin.ModelAdmin):
    """Two assets and the spread taken on each leg; the price is derived from the assets' prices.
    Lowering a spread waits for a second Administrator (convert/controls.py)."""

    list_display = ("__str__", "price", "spread_bps")
    list_select_related = ("base", "quote")

    @admin.display(description="price (derived from the asset prices)")
    def price(self, obj: Market):
        found = prices.source().book().mid(obj.base.code, obj.quote.code)
        return "-" if found is None else f"{found.price:.12g}"

    def get_urls(self):
        return [
            path("liquidity/", self.admin_site.admin_view(self.liquidity_view), name="convert_liquidity"),
            *super().get_urls(),
        ]

    def liquidity_view(self, request):
        if not self.has_view_permission(request):
            raise PermissionDenied
        may_top_up = request.user.has_perm(services.TOP_UP_PERMISSION)
        form = None
        if may_top_up:
            form = TopUpForm(request.POST or None, initial={"request_id": uuid.uuid4().hex})
            if request.method == "POST" and form.is_valid():
                data = form.cleaned_data
                posting_id = services.liquidity_top_up(
                    asset_code=data["asset"].code,
                    amount=data["amount"],
                    actor=request.user,
                    reason=data["reason"],
                    request_id=data["request_id"],
                )
                self.message_user(request, f"Liquidity topped up (posting #{posting_id}).", messages.SUCCESS)
                return redirect("admin:convert_liquidity")
        elif request.method == "POST":
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request),
            "title": "Convert liquidity",
            "opts": self.model._meta,
            "liquidity": sorted(selectors.liquidity_by_asset().items()),
            "shards": len(ledger.role_account_ids(SystemRole.CONVERT_LIQUIDITY)),
            "form": form,
        }
        return TemplateResponse(request, "admin/convert/market/liquidity.html", context)


@admin.register(Pair)
class PairAdmin(GuardedChangeAdmin, admin.ModelAdmin):
    """Bounds, precision, fee and the switch: a change that loosens one waits for a second
    Administrator (convert/controls.py); switching a pair off applies at once. Every change needs a
    reason (audited)."""

    list_display = ("__str__", "market", "min_source_amount", "max_source_amount", "precision", "fee_bps", "enabled")
    list_filter = ("enabled", "source", "target")
    list_select_related = ("source", "target", "market__base", "market__quote")
    actions = ["pairs_off", "pairs_on"]
    action_form = ReasonActionForm

    def _switch(self, request, queryset, on: bool) -> None:
        submit_to_each(
            self,
            request,
            queryset,
            {"enabled": on},
            done="{n} pair(s) switched.",
            waits="switching a pair on waits for another Administrator's approval.",
        )

    @admin.action(description="Switch pairs off (at once)", permissions=["change"])
    def pairs_off(self, request, queryset):
        self._switch(request, queryset, False)

    @admin.action(description="Switch pairs on (a second Administrator approves)", permissions=["change"])
    def pairs_on(self, request, queryset):
        self._switch(request, queryset, True)


@admin.register(Quote)
class QuoteAdmin(ReadOnlyAdmin):
    list_display = ("quote_id", "user", "pair", "source_amount", "target_amount", "price", "created_at", "expires_at")
    list_filter = ("pair", "created_at")
    search_fields = ("quote_id", "user__email")
    list_select_related = ("user", "pair__source", "pair__target")


@admin.register(Order)
class OrderAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "user",
        "pair",
        "source_amount",
        "target_amount",
        "fee",
        "price",
        "status",
        "error_message",
        "created_at",
    )
    list_filter = ("status", "pair", "created_at")
    search_fields = ("user__email", "quote__quote_id", "=id")
    list_select_related = ("user", "pair__source", "pair__target")
    raw_id_fields = ("quote", "user", "posting")
