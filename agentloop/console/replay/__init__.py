"""Record a conversation, replay it against a changed agent, compare the two (issue 58).

- `document`: the recording as a versioned JSON document, checked when read;
- `recording`: a conversation's recording, exported from its rows (masked on request);
- `masking`: personal data replaced by stable stand-ins;
- `playback` and `turn_step`: the replay — the recording's messages admitted again,
  in virtual time, into a sandbox copy of the channel, through the real intake, buffer,
  turns, guard and ledger, inside one transaction that is rolled back at the end;
- `recorded_agent`: the agent that plays a recording's answers back (a deterministic replay);
- `comparison`: the recorded and the replayed runs side by side;
- `suites`: a folder of recordings with expectations, for a team's CI.

It reads every app's tables, as the story page does, so it lives in the console, above them.
"""
