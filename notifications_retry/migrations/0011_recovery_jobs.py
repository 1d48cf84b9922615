"""Recovery jobs: a background requeue of every dead letter matching a filter (notifications_recover)."""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models

import notifications_retry.models


class Migration(migrations.Migration):

    dependencies = [
        ('notifications_retry', '0010_cheaper_due_at_and_event_ids'),
    ]

    operations = [
        migrations.CreateModel(
            name='RecoveryJob',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('since', models.DateTimeField(help_text='Dead-lettered at or after this time.')),
                ('until', models.DateTimeField(help_text='Dead-lettered before this time (and before the job was created).')),
                ('row_status', models.CharField(choices=[('dead-letter', 'Unresolved dead letters'), ('discarded', 'Discarded dead letters'), ('unresolvable', 'Unresolvable dead letters (retention expired)')], default='dead-letter', max_length=16)),
                ('state', models.CharField(choices=[('pending', 'Pending'), ('running', 'Running'), ('done', 'Done'), ('cancelled', 'Cancelled'), ('failed', 'Failed')], default='pending', max_length=16)),
                ('total', models.PositiveIntegerField(default=0, help_text='Rows matching when the job was created.')),
                ('done', models.PositiveIntegerField(default=0, help_text='Rows requeued.')),
                ('failed', models.PositiveIntegerField(default=0, help_text='Rows the requeue refused (see refusals).')),
                ('refusals', models.JSONField(blank=True, default=dict, help_text='Refusal reason -> count.')),
                ('cursor_at', models.DateTimeField(blank=True, editable=False, null=True)),
                ('cursor_id', models.UUIDField(blank=True, editable=False, null=True)),
                ('started_by', models.CharField(help_text="User name, stored in each requeue's audit row.", max_length=150)),
                ('reason', models.TextField(blank=True, default='')),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('started_at', models.DateTimeField(blank=True, null=True)),
                ('heartbeat_at', models.DateTimeField(blank=True, help_text='Last committed chunk.', null=True)),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
                ('cancelled_by', models.CharField(blank=True, default='', max_length=150)),
                ('last_error', models.TextField(blank=True, default='')),
                ('channel', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='recovery_jobs', to='notifications_retry.channelconfig')),
            ],
            options={
                'ordering': ['-created_at', '-id'],
                'permissions': [('cancel_recoveryjob', 'Can cancel recovery jobs')],
                'indexes': [models.Index(condition=models.Q(('state__in', ['pending', 'running'])), fields=['state'], name='nr_recovery_active_idx')],
                'constraints': [models.UniqueConstraint(condition=models.Q(('state__in', ['pending', 'running'])), fields=('channel', 'since', 'until', 'row_status'), name='nr_recovery_one_active_per_filter'), notifications_retry.models.check_constraint(models.Q(('since__lt', models.F('until'))), 'nr_recovery_since_before_until'), notifications_retry.models.check_constraint(models.Q(('state__in', ['pending', 'running', 'done', 'cancelled', 'failed'])), 'nr_recovery_state_valid'), notifications_retry.models.check_constraint(models.Q(('row_status__in', ['dead-letter', 'discarded', 'unresolvable'])), 'nr_recovery_row_status_valid')],
            },
        ),
    ]
