# The fallback CHECK names the primary key as F("id") instead of F("pk"): the same SQL, so the database
# keeps its constraint (state only), but Django 4.2's full_clean, which checks constraints in Python,
# could not resolve "pk" and failed every channel form.

from django.db import migrations, models

import notifications_retry.models


class Migration(migrations.Migration):

    dependencies = [
        ('notifications_retry', '0021_wakeup_counts_the_lease_expiry'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveConstraint(
                    model_name='channelconfig',
                    name='nr_channel_fallback_not_itself',
                ),
                migrations.AddConstraint(
                    model_name='channelconfig',
                    constraint=notifications_retry.models.check_constraint(
                        ~models.Q(fallback=models.F('id')), 'nr_channel_fallback_not_itself'
                    ),
                ),
            ],
        ),
    ]
