# Downloads run on the submit host in cluster runs: compute nodes often have no internet.
localrules:
    fetch,
    fetch_init,


# The jobs of a run that read a Hub checkpoint's weights after its fetch: each gets a copy of the folder by hard links
# (anisweep.weights.fetched), read in place and removed when the job ends, so that no byte moves twice.
FETCH_READERS = ("weights", "weight_measure", "logit_lens")


def fetch_record(wildcards):
    """What fetch fetched (repo, revision, commit), kept after its weights are deleted: the weights jobs' order after
    fetch (weights_inputs.smk, after_fetch)."""
    return f"weights/{wildcards.family}/{wildcards.model}/step{wildcards.step}.json"


def shared_copy(wildcards, reader):
    """The copy of a checkpoint's fetched weights for one job reading them (`weights`, `logit_lens`,
    `measure-{name}`)."""
    return f"weights/{wildcards.family}/{wildcards.model}/step{wildcards.step}.read-by-{reader}"


def reader_name(job):
    return f"measure-{job.wildcards.measure}" if job.rule.name == "weight_measure" else job.rule.name


class SharedCopies:
    """fetch's `--share-with`: a copy for each job of this run that reads the Hub checkpoint's weights after fetch
    and waits for it (the logit lens, after extract; a weight measure, after the record), from Snakemake's DAG when
    the command is written, once the jobs to run are known (an internal API: where it cannot say, no copy, and
    those jobs read by range requests)."""

    def __init__(self, wildcards):
        self.wildcards = wildcards
        self.key = (wildcards.family, wildcards.model, wildcards.step)

    def _waits(self, job):
        return job.rule.name == "logit_lens" or fetch_record(self.wildcards) in map(str, job.input)

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


# Weights live here only until extract has read them (temp), unless fetch.keep_weights keeps them
# in the Hugging Face cache. The checkpoint's config.json and tokenizer are checked against the extract
# settings and the corpus before any weights move (anisweep.checkpoints.preflight). Its params are untracked:
# a fetch reruns when extract needs the weights again, and a change to what a checkpoint is (its identity, its
# folder's content) is extract's recorded `source` param, so that a fetch never reruns the model runs itself.
rule fetch:
    input:
        toy_checkpoints_dir,
        texts=rules.corpus.output[0],
    output:
        folder=temp(directory("weights/{family}/{model}/step{step}")),
        record="weights/{family}/{model}/step{step}.json",
    log:
        "logs/fetch/{family}/{model}/step{step}.log",
    conda:
        CONDA_ENV
    params:
        on_failure=on_failure("fetch"),
        cli=CLI,
        checkpoint=untracked(lambda wc: json_arg(checkpoint_of(wc).to_dict())),
        keep=untracked("--keep-weights" if config["fetch"]["keep_weights"] else ""),
        retries=untracked(config["fetch"]["retries"]),
        settings=untracked(json_arg(config["extract"])),
        audited=untracked(audited_sha256),
        share=untracked(SharedCopies),
    shell:
        "{params.cli} fetch --checkpoint {params.checkpoint} --out {output.folder} --record {output.record} "
        "{params.keep} --retries {params.retries} --texts {input.texts} --settings {params.settings} "
        "--audited-sha256 {params.audited} {params.share} 2> {log} {params.on_failure}"


# The untrained block's swept-model inits (untrained.inits: {model: ...}) get their own copy of the weights: were
# it a consumer of extract's, a change to either would rerun the other's model runs (Snakemake reruns every
# consumer of a file it makes again). A Hub init is downloaded twice without fetch.keep_weights.
use rule fetch as fetch_init with:
    output:
        folder=temp(directory("weights/untrained/{family}/{model}/step{step}")),
        record="weights/untrained/{family}/{model}/step{step}.json",
    log:
        "logs/fetch_init/{family}/{model}/step{step}.log",
    params:
        on_failure=on_failure("fetch_init"),
        cli=CLI,
        checkpoint=untracked(lambda wc: json_arg(checkpoint_of(wc).to_dict())),
        keep=untracked("--keep-weights" if config["fetch"]["keep_weights"] else ""),
        retries=untracked(config["fetch"]["retries"]),
        settings=untracked(json_arg(config["extract"])),
        audited=untracked(audited_sha256),
        share="",
