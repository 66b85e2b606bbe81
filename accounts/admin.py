from django import forms
from django.contrib import admin, messages
from django.contrib.auth.admin import UserAdmin as DjangoUserAdmin
from django.contrib.auth.forms import UserChangeForm, UserCreationForm
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Count
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from accounts import services, staff
from accounts.models import ApiKey, ApiKeyStatus, ApiKeyType, User
from exchange.backoffice import changes
from exchange.backoffice.services import ReasonRequired
from exchange.backoffice.toolkit import ChangeOutcomeResponses, ReasonActionForm, ReasonFieldAdmin, action_reason


class _AccountFormRules:
    """The rules accounts.services applies (user_create_by_staff, user_change_by_staff), checked on
    the form too so that a mistake is shown beside its field; the services decide."""

    def clean_email(self):
        try:
            return services.email_clean(
                self.cleaned_data["email"], exclude_id=self.instance.pk, keep=self.instance.email or ""
            )
        except ValueError as exc:
            raise ValidationError(str(exc)) from exc

    def clean_master(self):
        master = self.cleaned_data.get("master")
        if master is not None and master.master_id is not None:
            raise ValidationError("A sub-account cannot be the master of another account.")
        if master is not None and self.instance.pk and master.pk == self.instance.pk:
            raise ValidationError("An account cannot be its own master.")
        if master is not None and (master.system_role is not None or master.is_staff):
            raise ValidationError("Only a customer account can be a master.")
        return master

    def clean_phone(self):
        try:
            return services.phone_clean(self.cleaned_data.get("phone"), exclude_id=self.instance.pk)
        except ValueError as exc:
            raise ValidationError(str(exc)) from exc


REASON_HELP = "Why (required): kept in the audit trail with your name."


class AccountCreationForm(_AccountFormRules, UserCreationForm):
    reason = forms.CharField(max_length=500, widget=forms.TextInput(attrs={"size": 60}), help_text=REASON_HELP)

    class Meta:
        model = User
        fields = ("email", "phone", "master")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if "master" in self.fields:
            self.fields["master"].help_text = (
                "For a sub-account: its master. The account is created on its own and put under this "
                "master only when a second Administrator approves (a change request is proposed)."
            )


class AccountChangeForm(_AccountFormRules, UserChangeForm):
    reason = forms.CharField(
        max_length=500,
        required=False,  # required when something changes: UserAdmin.save_model
        widget=forms.TextInput(attrs={"size": 60}),
        help_text="Why you change this account (required for a change): kept in the audit trail with your name.",
    )

    class Meta:
        model = User
        fields = "__all__"

    def clean(self):
        data = super().clean()
        changed = [name for name in self.changed_data if name != "reason"]
        if self.instance.pk and changed and not (data.get("reason") or "").strip():
            self.add_error("reason", "A reason is required: say why (it is kept in the audit trail).")
        return data


PRIVILEGE_FIELDS = services.PRIVILEGE_FIELDS
may_edit_user = services.may_edit_user  # where it was (tests/security/test_money_out.py)


class AccountKindFilter(admin.SimpleListFilter):
    title = "kind"
    parameter_name = "kind"

    def lookups(self, request, model_admin):
        return (("master", "Masters (with sub-accounts)"), ("sub", "Sub-accounts"), ("house", "House accounts"))

    def queryset(self, request, queryset):
        if self.value() == "master":
            return queryset.filter(sub_accounts__isnull=False).distinct()
        if self.value() == "sub":
            return queryset.filter(master__isnull=False)
        if self.value() == "house":
            return queryset.filter(system_role__isnull=False)
        return queryset


@admin.register(User)
class UserAdmin(ChangeOutcomeResponses, DjangoUserAdmin):
    """Accounts for operators (the Operations group may change users). Only a superuser grants or
    changes staff status, superuser status, groups and permissions, its own included: for anyone
    else those fields are read-only, so they are not in the form and a crafted POST cannot set
    them. Staff and superuser records are read-only to non-superusers (`may_edit_user`), which also
    closes their password-change page."""

    form = AccountChangeForm
    add_form = AccountCreationForm
    ordering = ("id",)
    list_display = ("id", "email", "phone", "master", "is_virtual", "is_frozen", "is_active", "is_staff", "date_joined")
    list_filter = (AccountKindFilter, "is_active", "is_staff", "is_frozen", "is_virtual")
    search_fields = ("email", "phone", "master__email")
    list_select_related = ("master",)
    actions = ["freeze_accounts", "unfreeze_accounts"]
    action_form = ReasonActionForm
    raw_id_fields = ("master",)
    readonly_fields = ("system_role", "sub_account_list")
    fieldsets = (
        (None, {"fields": ("email", "phone", "password")}),
        ("Account", {"fields": ("master", "is_virtual", "is_frozen", "is_active", "system_role")}),
        (
            "Permissions and limits",
            {
                "fields": (
                    "can_trade",
                    "can_deposit",
                    "can_withdraw",
                    "enable_withdraw_whitelist",
                    "base_token",
                    "limit_tier",
                )
            },
        ),
        ("Staff", {"fields": ("is_staff", "is_superuser", "groups", "user_permissions")}),
        ("Dates", {"fields": ("last_login", "date_joined")}),
    )
    add_fieldsets = (
        (None, {"classes": ("wide",), "fields": ("email", "phone", "master", "password1", "password2", "reason")}),
    )

    def get_fieldsets(self, request, obj=None):
        fieldsets = super().get_fieldsets(request, obj)
        if obj is not None and self.has_change_permission(request, obj):
            fieldsets = (*fieldsets, ("Why", {"fields": ("reason",)}))  # a change is audited
        if obj is None or obj.master_id is not None or obj.system_role is not None:
            return fieldsets
        # A master's sub-accounts on its page (a sub-account cannot be a master: it has none).
        return (*fieldsets[:2], ("Sub-accounts", {"fields": ("sub_account_list",)}), *fieldsets[2:])

    def save_model(self, request, obj, form, change):
        """Through accounts.services: a new account by user_create_by_staff (under a master only by
        a proposal a second Administrator approves), a change by user_change_by_staff (e-mail,
        phone, master, virtual, tier and whitelist-off only by such a proposal). A refusal or a
        proposal changes nothing here; ChangeOutcomeResponses answers the page."""
        data = form.cleaned_data
        if not change:
            try:
                created, proposal = services.user_create_by_staff(
                    actor=request.user,
                    email=data["email"],
                    phone=data.get("phone"),
                    password=data.get("password1"),
                    master=data.get("master"),
                    reason=data.get("reason"),
                )
            except (services.StaffChangeRefused, changes.ChangeRefused, ReasonRequired) as exc:
                raise PermissionDenied(str(exc)) from exc  # the form checked the same: a crafted or raced POST
            obj.pk = created.pk
            obj.refresh_from_db()  # the row the service wrote, which the admin then logs and links to
            request._master_proposal = proposal
            return
        changed = [name for name in form.changed_data if name not in ("reason", "password")]
        if not changed:
            return
        try:  # groups and permissions (a superuser's) are saved by save_related, in the same transaction
            request._change_outcome = services.user_change_by_staff(
                actor=request.user, user=obj, changes={name: data[name] for name in changed}, reason=data.get("reason")
            )
        except (services.StaffChangeRefused, changes.ChangeRefused, ReasonRequired) as exc:
            request._change_refused = str(exc)

    def save_related(self, request, form, formsets, change):
        # Groups and permissions (a superuser's) are saved only beside a change that was applied.
        if getattr(request, "_change_refused", None) is None and (
            getattr(request, "_change_outcome", None) is None or request._change_outcome.applied
        ):
            super().save_related(request, form, formsets, change)

    def response_add(self, request, obj, post_url_continue=None):
        outcome = getattr(request, "_master_proposal", None)
        if outcome is not None and outcome.request is not None:
            self.message_user(
                request,
                f"Account {obj} created on its own. Putting it under its master is proposed as change request "
                f"#{outcome.request.pk}: another Administrator must approve it.",
                messages.WARNING,
            )
            return HttpResponseRedirect(reverse("admin:exchange_changerequest_change", args=[outcome.request.pk]))
        return super().response_add(request, obj, post_url_continue)

    @admin.display(description="sub-accounts")
    def sub_account_list(self, obj: User) -> str:
        """Each sub-account with a link to its page, its state, its keys and a link to a new key for
        it. Frozen and unfrozen on its own page or by the list's actions; created by the master
        through the API or on the "Add user" page."""
        subs = list(obj.sub_accounts.order_by("id").annotate(keys=Count("api_keys")))
        if not subs:
            return "None."
        rows = format_html_join(
            "",
            '<tr><td><a href="{}">{}</a></td><td>{}</td><td>{}</td><td>{}</td>'
            '<td><a href="{}?user__id__exact={}">{}</a></td><td><a href="{}?user={}">Create an API key</a></td></tr>',
            (
                (
                    reverse("admin:accounts_user_change", args=[sub.pk]),
                    sub.email,
                    "virtual" if sub.is_virtual else "",
                    "FROZEN" if sub.is_frozen else "",
                    "" if sub.is_active else "inactive",
                    reverse("admin:accounts_apikey_changelist"),
                    sub.pk,
                    f"{sub.keys} key(s)",
                    reverse("admin:accounts_apikey_add"),
                    sub.pk,
                )
                for sub in subs
            ),
        )
        return format_html("<table><tbody>{}</tbody></table>", rows)

    def _set_frozen(self, request, queryset, frozen: bool) -> None:
        reason = action_reason(self, request)
        if reason is None:
            return
        done = skipped = 0
        for user in queryset:
            try:
                staff.account_set_frozen(actor=request.user, user=user, frozen=frozen, reason=reason)
            except services.StaffChangeRefused:  # a staff or house account
                skipped += 1
                continue
            except PermissionDenied as exc:
                self.message_user(request, f"Refused: {exc}", messages.ERROR)
                return
            done += 1
        verb = "frozen" if frozen else "unfrozen"
        self.message_user(request, f"{done} account(s) {verb}.", messages.SUCCESS)
        if skipped:
            note = f"{skipped} account(s) skipped: staff or house accounts are not yours to change."
            self.message_user(request, note, messages.WARNING)

    @admin.action(description="Freeze the selected accounts (no money out, API keys refused)", permissions=["change"])
    def freeze_accounts(self, request, queryset):
        self._set_frozen(request, queryset, True)

    @admin.action(description="Unfreeze the selected accounts", permissions=["change"])
    def unfreeze_accounts(self, request, queryset):
        self._set_frozen(request, queryset, False)

    def get_readonly_fields(self, request, obj=None):
        fields = tuple(super().get_readonly_fields(request, obj))
        if request.user.is_superuser:
            return fields
        return fields + tuple(name for name in PRIVILEGE_FIELDS if name not in fields)

    def has_change_permission(self, request, obj=None) -> bool:
        if not super().has_change_permission(request, obj):
            return False
        return obj is None or may_edit_user(request.user, obj)

    def has_delete_permission(self, request, obj=None) -> bool:
        if not super().has_delete_permission(request, obj):
            return False
        return obj is None or may_edit_user(request.user, obj)


class ShownOnce(str):
    """A new key's secret on its creation page: rendered as itself, represented as a mask. Django
    writes the whole template context (every dict's repr) into the django.template logger's DEBUG
    line for each variable the admin's templates fail to look up (`subtitle`, ...): with LOG_LEVEL
    at DEBUG the plain secret went to the logs (found by tests/security/test_secrets_in_logs.py)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "'<secret: shown on this page only>'"


class ApiKeyForm(forms.ModelForm):
    types = forms.MultipleChoiceField(
        choices=ApiKeyType.choices,
        widget=forms.CheckboxSelectMultiple,
        required=False,
        help_text="None ticked: every functional type. 'Read only' overrides the others.",
    )
    ip_list = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}), required=False, help_text="One address or CIDR network per line."
    )
    reason = forms.CharField(
        max_length=500,
        widget=forms.TextInput(attrs={"size": 60}),
        help_text="Why (required): kept in the audit trail with your name.",
    )

    class Meta:
        model = ApiKey
        fields = ("user", "name", "types", "status", "ip_restrict", "ip_list")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # A view-only user's form has no fields to adjust.
        if self.instance.pk:
            self.initial["ip_list"] = "\n".join(self.instance.ip_list)
            if "user" in self.fields:
                self.fields["user"].disabled = True
        else:
            if "status" in self.fields:
                self.fields["status"].disabled = True
            if "user" in self.fields:  # the service's own ledger accounts have no API
                self.fields["user"].queryset = self.fields["user"].queryset.filter(system_role__isnull=True)
            if "types" in self.fields:
                # Staff issue read-only keys only (accounts.services.api_key_issue_by_staff): a
                # crafted POST of other types is ignored, as for any disabled field.
                self.fields["types"].disabled = True
                self.fields["types"].initial = [ApiKeyType.READ_ONLY]
                self.fields["types"].help_text = services.STAFF_KEY_READ_ONLY

    def clean_types(self):
        try:
            types = services.normalize_key_types(self.cleaned_data["types"])
        except ValueError as exc:
            raise ValidationError(str(exc)) from exc
        if self.instance.pk and not services.staff_may_set_key_types(old=self.instance.types, new=types):
            raise ValidationError(services.STAFF_KEY_NO_WIDENING)
        return types

    def clean_ip_list(self):
        try:
            return services.normalize_ip_list(self.cleaned_data["ip_list"].splitlines())
        except ValueError as exc:
            raise ValidationError(f"Not an IP address or network: {exc}") from exc


@admin.register(ApiKey)
class ApiKeyAdmin(ReasonFieldAdmin, admin.ModelAdmin):
    """Keys are created, changed, enabled and disabled with a reason (audited). Staff never hold a
    credential that acts for a customer: a key made here is Read only (its secret, shown once to
    hand to the customer, reads what staff see anyway), and a key's types are only ever narrowed
    here (accounts.staff.api_key_issue and api_key_change, which check the permission and audit). The secret is shown
    once, on the page the creation answers with, and never again: it is not a field of any page,
    the audit trail or the change history (docs/operations.md)."""

    form = ApiKeyForm
    list_display = ("name", "short_key", "user", "status", "type_list", "ip_restrict", "created_at")
    list_filter = ("status", "ip_restrict")
    search_fields = ("name", "key", "user__email")
    raw_id_fields = ("user",)
    actions = ["enable_keys", "disable_keys"]
    action_form = ReasonActionForm

    @admin.display(description="key")
    def short_key(self, obj: ApiKey) -> str:
        return f"{obj.key[:12]}…"

    @admin.display(description="types")
    def type_list(self, obj: ApiKey) -> str:
        return ", ".join(obj.types)

    def save_model(self, request, obj, form, change):
        data = form.cleaned_data
        if change:
            staff.api_key_change(
                actor=request.user,
                api_key=obj,
                name=data["name"],
                types=data["types"],
                enabled=data["status"] == ApiKeyStatus.ENABLE,
                ip_restrict=data["ip_restrict"],
                ip_list=data["ip_list"],
                reason=data["reason"],
            )
            return
        created = staff.api_key_issue(
            actor=request.user,
            user=data["user"],
            name=data["name"],
            types=data["types"],
            ip_list=data["ip_list"],
            ip_restrict=data["ip_restrict"],
            reason=data["reason"],
        )
        obj.pk = created.api_key.pk
        obj.refresh_from_db()  # the row the service wrote, which the admin then logs and links to
        # Shown once, on the page this request renders; never stored in the session or a message.
        request._created_api_key_secret = created.secret

    def response_add(self, request, obj, post_url_continue=None):
        secret = getattr(request, "_created_api_key_secret", None)
        if secret is None:
            return super().response_add(request, obj, post_url_continue)
        context = {
            **self.admin_site.each_context(request),
            "api_key": obj,
            "secret": ShownOnce(secret),
            "opts": self.model._meta,
            "title": "API key created",
        }
        response = TemplateResponse(request, "admin/accounts/apikey/created.html", context)
        response["Cache-Control"] = "no-store"
        return response

    def _set_status(self, request, queryset, enabled: bool) -> None:
        reason = action_reason(self, request)
        if reason is None:
            return
        for key in queryset:
            try:
                staff.api_key_set_status(actor=request.user, api_key=key, enabled=enabled, reason=reason)
            except PermissionDenied as exc:
                self.message_user(request, f"Refused: {exc}", messages.ERROR)
                return
        self.message_user(request, f"Keys {'enabled' if enabled else 'disabled'}.", messages.SUCCESS)

    @admin.action(description="Enable the selected keys", permissions=["change"])
    def enable_keys(self, request, queryset):
        self._set_status(request, queryset, True)

    @admin.action(description="Disable the selected keys", permissions=["change"])
    def disable_keys(self, request, queryset):
        self._set_status(request, queryset, False)


from accounts.ledger import admin as ledger_admin  # noqa: E402,F401 - registers the ledger's admin pages
