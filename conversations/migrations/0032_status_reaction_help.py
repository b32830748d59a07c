# A channel's status reaction: its help names no platforms (Discord has reactions too; issue 54).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('conversations', '0031_mediafile_ref_2000'),
    ]

    operations = [
        migrations.AlterField(
            model_name='channel',
            name='status_reaction',
            field=models.CharField(choices=[('off', 'Off'), ('seen_done', '👀 while the window and the turn run, then ✅ when answered'), ('seen', '👀 while the window and the turn run, removed when answered')], default='off', help_text='A "seen" reaction on the person\'s message, on the platforms that have reactions (docs/platforms.md), best effort (docs/buffer.md#reactions).', max_length=16, verbose_name='status reaction'),
        ),
    ]
