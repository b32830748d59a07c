# A Teams file's downloadUrl (its pre-authorised token in the query) runs past 500
# characters (issue 54).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('conversations', '0030_platform_addresses'),
    ]

    operations = [
        migrations.AlterField(
            model_name='mediafile',
            name='ref',
            field=models.CharField(help_text="What fetching it takes (Telegram's file_id).", max_length=2000, verbose_name='ref'),
        ),
    ]
