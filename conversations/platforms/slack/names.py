"""The values of the Slack channel's settings (imported by the package and its modules alike)."""

PER_CHANNEL, PER_THREAD = "channel", "thread"  # `conversations`: one per Slack channel and person, or per thread
