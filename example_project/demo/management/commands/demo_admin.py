"""``manage.py demo_admin``: a demo superuser with a fresh password, then the admin on the demo data.

``make demo-admin`` runs it. Runs the demo first when the database holds no demo rows yet, so the
admin always has dead letters, sent and waiting rows to show. Local use only: the server listens on
127.0.0.1 and the password changes on every run.
"""

from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser

from example_project.demo.management.commands.demo import CORRELATION_PREFIX
from notifications_retry.models import NotificationEntity

USERNAME = "demo"


class Command(BaseCommand):
    help = "Create (or reset) the demo superuser, print its credentials and serve the admin on the demo data."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, default=8000, help="Port on 127.0.0.1 (default 8000).")
        parser.add_argument(
            "--no-server", action="store_true", help="Create the user and print the credentials only."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        call_command("migrate", interactive=False, verbosity=0)
        if not NotificationEntity.objects.filter(correlation_id__startswith=CORRELATION_PREFIX).exists():
            call_command("demo", stdout=self.stdout)
        password = secrets.token_urlsafe(12)
        user, _ = get_user_model().objects.update_or_create(
            username=USERNAME, defaults={"is_staff": True, "is_superuser": True, "email": ""}
        )
        user.set_password(password)
        user.save()
        url = f"http://127.0.0.1:{options['port']}/admin/notifications_retry/notificationentity/"
        self.stdout.write(f"demo admin: {url}\n  username: {USERNAME}\n  password: {password}")
        if options["no_server"]:
            return
        self.stdout.write("Ctrl-C stops the server.", ending="\n")
        self.stdout.flush()
        call_command("runserver", f"127.0.0.1:{options['port']}", use_reloader=False)
