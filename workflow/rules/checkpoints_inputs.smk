# fetch's constants and input functions (its rules: workflow/rules/checkpoints.smk).


# The jobs of a run that read a Hub checkpoint's weights after its fetch: each gets a copy of the folder by hard links
# (anisweep.weights.fetched), read in place and removed when the job ends, so that no byte moves twice.
FETCH_READERS = ("weights", "weight_measure", "logit_lens")


def fetch_log(wildcards):
    """fetch's log, written by every fetch and kept after its weights are deleted: the weight measures' order after
    fetch (weights_inputs.smk, after_fetch)."""
    return f"logs/fetch/{wildcards.family}/{wildcards.model}/step{wildcards.step}.log"


def shared_copy(wildcards, reader):
    """The copy of a checkpoint's fetched weights for one job reading them (`weights`, `logit_lens`,
    `measure-{name}`)."""
    return f"weights/{wildcards.family}/{wildcards.model}/step{wildcards.step}.read-by-{reader}"


def reader_name(job):
    return f"measure-{job.wildcards.measure}" if job.rule.name == "weight_measure" else job.rule.name


class SharedCopies:
    """fetch's `--share-with`: a copy for each job of this run that reads the Hub checkpoint's weights after fetch
    and waits for it (the logit lens, after extract; a weight measure, after fetch's log), from Snakemake's DAG when
    the command is written, once the jobs to run are known (an internal API: where it cannot say, no copy, and
    those jobs read by range requests)."""

    def __init__(self, wildcards):
        self.wildcards = wildcards
        self.key = (wildcards.family, wildcards.model, wildcards.step)

    def _waits(self, job):
        return job.rule.name == "logit_lens" or fetch_log(self.wildcards) in map(str, job.input)

    def __str__(self):
        if not checkpoint_of(self.wildcards).is_hub:
            return ""
        try:
            readers = [
                job
                for job in workflow.dag.needrun_jobs()
                if job.rule.name in FETCH_READERS
                and (job.wildcards.family, job.wildcards.model, job.wildcards.step) == self.key
                and self._waits(job)
            ]
        except Exception:  # noqa: BLE001 - an internal Snakemake API: the readers read by range requests
            return ""
        copies = sorted(shared_copy(self.wildcards, reader_name(job)) for job in readers)
        return f"--share-with {' '.join(map(shlex.quote, copies))}" if copies else ""

    def __format__(self, spec):
        return format(str(self), spec)
