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


class FetchReaders:
    """The jobs of this run that read a Hub checkpoint's weights after its fetch and wait for it (the logit lens,
    after extract; a weight measure, after fetch's log), by checkpoint: one walk of Snakemake's DAG for every fetch
    job, not one each, so that writing the fetch jobs' commands takes time linear in the jobs. Walked again when the
    DAG is another one or holds other jobs; a job it has since finished, or no longer runs, is left out."""

    def __init__(self):
        self.dag, self.size, self.by_checkpoint = None, None, {}

    def of(self, dag, key):
        if dag is not self.dag or len(dag) != self.size:
            self.dag, self.size, self.by_checkpoint = dag, len(dag), self.index(dag)
        return [job for job in self.by_checkpoint.get(key, ()) if dag.needrun(job) and not dag.finished(job)]

    @staticmethod
    def index(dag):
        by_checkpoint = {}
        for job in dag.needrun_jobs(exclude_finished=False):
            if job.rule.name in FETCH_READERS and waits_for_fetch(job):
                key = (job.wildcards.family, job.wildcards.model, job.wildcards.step)
                by_checkpoint.setdefault(key, []).append(job)
        return by_checkpoint


def waits_for_fetch(job):
    return job.rule.name == "logit_lens" or fetch_log(job.wildcards) in map(str, job.input)


FETCHED_READERS = FetchReaders()


class SharedCopies:
    """fetch's `--share-with`: a copy for each job of this run that reads the Hub checkpoint's weights after fetch
    and waits for it (FetchReaders), from Snakemake's DAG when the command is written, once the jobs to run are
    known (an internal API: where it cannot say, no copy, and those jobs read by range requests)."""

    def __init__(self, wildcards):
        self.wildcards = wildcards
        self.key = (wildcards.family, wildcards.model, wildcards.step)

    def __str__(self):
        if not checkpoint_of(self.wildcards).is_hub:
            return ""
        try:
            readers = FETCHED_READERS.of(workflow.dag, self.key)
        except Exception:  # noqa: BLE001 - an internal Snakemake API: the readers read by range requests
            return ""
        copies = sorted(shared_copy(self.wildcards, reader_name(job)) for job in readers)
        return f"--share-with {' '.join(map(shlex.quote, copies))}" if copies else ""

    def __format__(self, spec):
        return format(str(self), spec)
