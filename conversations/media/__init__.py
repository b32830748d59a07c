"""Files users send — a photo, an album's items, a voice note, a document — fetched from
the platform after their message is stored, and shown to the agent.

- `files`: the MediaFile row of an inbound message, written by its admission (one per
  platform file: a re-delivered update, or the same photo twice, is fetched once)
- `fetching`: the worker's side: due files claimed by compare-and-swap, fetched through
  their platform (`Platform.fetch_media`) under a deadline and a size cap, the content
  type sniffed from the bytes, stored in Django's default storage; a failed try retried
  with backoff, then given up (the model is told the file could not be read)
- `download`: a capped, deadlined HTTP download (the platforms' fetches use it)
- `sniff`: what the bytes are, never what the name says
- `for_agents`: what a turn's agent receives (`TurnMedia`): images as content parts
  (downscaled), documents by name and type with their text, the rest described
"""
