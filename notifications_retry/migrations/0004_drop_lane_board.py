# Lanes split a channel's limits statically (LANES[name]["shares"]): the run-time board's columns go.

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("notifications_retry", "0003_lane_board"),
    ]

    operations = [
        migrations.RemoveField(model_name="workerheartbeat", name="active_until"),
        migrations.RemoveField(model_name="workerheartbeat", name="idle"),
        migrations.RemoveField(model_name="workerheartbeat", name="settled_seen"),
        migrations.RemoveField(model_name="workerheartbeat", name="share_token"),
    ]
