"""The nouns and the decisions of a podium run: pure, no I/O, importing nothing else of podium.

- `records`: a checkpoint's record and its statuses, the champion
- `events`: what a checkpoint announcement carries, what a report asked of validation, what a validation returned
- `verdict`: a checkpoint's verdict, decided by one function (`decide_verdict`)
- `promotion`: the best checkpoint and the promotion decision
- `comparison`: which numbers a promotion compared, on which data (the same-data gate)
- `numbers`: finite or not, listed for people
- `failures`: failure reasons as people read them
- `redaction`: credentials kept out of messages, logs and records
- `version`: podium's version
"""
