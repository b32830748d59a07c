from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("delivery", "0004_ledger_chunks"),
    ]

    operations = [
        migrations.AlterField(
            model_name="outboundmessage",
            name="last_outcome",
            field=models.CharField(blank=True, choices=[
                ("delivered", "Delivered"), ("flood", "Flood control (retry after)"),
                ("temporary", "Temporary failure"), ("permanent", "Permanent failure"),
                ("ambiguous", "Ambiguous (may have arrived)"),
                ("channel_blocked", "Channel blocked (credentials refused)")], max_length=16),
        ),
        migrations.AlterField(
            model_name="outboundmessage",
            name="reply_target",
            field=models.CharField(blank=True, max_length=200),
        ),
    ]
