import django.db.models.deletion
from django.db import migrations, models

import notifications_retry.models


class Migration(migrations.Migration):
    dependencies = [
        ("notifications_retry", "0006_cheaper_writes"),
    ]

    operations = [
        migrations.AddField(
            model_name="channelconfig",
            name="fallback",
            field=models.ForeignKey(
                blank=True,
                help_text="When this channel's provider refuses an attempt before processing it (connection "
                "refused, 429/503, circuit open), the same attempt goes to this channel's provider. Empty: none.",
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="fallback_for",
                to="notifications_retry.channelconfig",
            ),
        ),
        migrations.AddConstraint(
            model_name="channelconfig",
            constraint=notifications_retry.models.check_constraint(
                models.Q(("fallback", models.F("pk")), _negated=True), "nr_channel_fallback_not_itself"
            ),
        ),
    ]
