"""The shell text after a rule's command (`... 2> {log}`) that makes a failing job leave one line on the console:
the last line of its log (the CLI's cause line), or, when the command could not write its log (a full disk), that
it wrote none, with the free space where the log was to go; a kill by a signal named as such; and the command's
exit status kept."""

from __future__ import annotations

_LOG, _KEY = "\0log\0", "\0key\0"


def failure_suffix(log: str, key: str, name_in_line: bool) -> str:
    """The suffix for a job whose log is `log` and whose lines start with `key` (both shell words, quoted as
    needed). `name_in_line`: prefix the log's last line with `key` (a command that does not name its checkpoint
    itself)."""
    last = f'echo {key}": $(tail -n 1 {log})"' if name_in_line else f"tail -n 1 {log}"
    free = f'$(df -Ph "$(dirname {log})" | awk \'NR == 2 {{print $4 " free on " $6}}\')'
    return (
        f'|| {{ rc=$?; if [ -s {log} ]; then {last} >&2; else echo {key}": exit status $rc and nothing in its log '
        f'{log}: is the disk holding it full? ({free})" >&2; fi; if [ $rc -gt 128 ]; then echo {key}": killed by '
        f"signal $((rc - 128)) (9: out of memory, or a scheduler's limit)\" >&2; fi; exit $rc; }}"
    )


def failure_suffix_template(key_fields: str, name_in_line: bool) -> str:
    """The same suffix as text of a rule's `shell:` (its braces doubled), the log and key left to Snakemake's own
    formatting: `{log:q}` and `key_fields` (e.g. `plot_model' '{wildcards.family:q}/{wildcards.model:q}`)."""
    text = failure_suffix(_LOG, _KEY, name_in_line).replace("{", "{{").replace("}", "}}")
    return text.replace(_LOG, "{log:q}").replace(_KEY, key_fields)
