"""Tasks for ``ppojax.rlhf``: prompts, models and rewards built on the library (which never
imports them). ``sorting``: sort digits, scored by a learned reward model; ``reversal``:
reverse digits, scored by a checker (a verifiable reward)."""
