import json
import os
import shlex
import sys
import threading
from pathlib import Path
from types import FunctionType, MethodType, SimpleNamespace

from snakemake.settings.types import DeploymentMethod

from anisweep import config as anisweep_config
from anisweep.checkpoints.catalogue import final_step, params_millions
from anisweep.code_inputs import code_inputs
from anisweep.checkpoints.identity import source_identity
from anisweep.checkpoints import sweep_audit
from anisweep.checkpoints.audit import AuditError
from anisweep.checkpoints.config_checks import check_local_runs
from anisweep.adapters import UnsupportedArchitecture, adapter_for
from anisweep.checkpoints.hub_repo import HubRepo, check_hub_config
from anisweep.checkpoints.preflight import PreflightError, check_corpus_modality
from anisweep.measures.partial import Sweep, remove_fetched_weights, write_partial_sweeps
from anisweep.plots.sweep import MODEL_FIGURES
from anisweep.tables import UNTRAINED_TABLES
from anisweep.plots.untrained import UNTRAINED_FIGURES
from anisweep.mechanism import untrained_inits
from anisweep.errors import ConfigError
from anisweep.worker import address as worker_address
from anisweep.job_failure import failure_suffix, failure_suffix_template
from anisweep.measures.registry import InstalledMeasureError, MeasureError, user_measures
from anisweep.measures.stale import code_record, remove_stale_measure_outputs

# Every rule calls the package's CLI with the interpreter that runs Snakemake, so an unactivated
# virtual environment works as well as an activated one. With `--sdm conda`, with the python of the rule's conda
# environment (CONDA_ENV: the package's dependencies), running the package from the source checkout next to
# the Snakefile.
ANISWEEP = f"{shlex.quote(sys.executable)} -m anisweep"
CONDA_ENV = "../envs/anisweep.yaml"
if DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method:
    SOURCE = Path(workflow.basedir) / "src"
    if not (SOURCE / "anisweep" / "__init__.py").is_file():
        raise WorkflowError(f"--sdm conda runs the package from its source checkout, but {SOURCE} has none")
    ANISWEEP = f"PYTHONPATH={shlex.quote(str(SOURCE))} python -m anisweep"

# A local run hands its commands to a warm worker that imports torch and transformers once and forks a process per
# job (anisweep.worker; ANISWEEP_WORKER=off turns it off). A cluster's jobs, each on its own node, never use one.
if workflow.is_main_process and workflow.local_exec and not workflow.touch:
    worker_address.offer(os.environ)

# The config validated against the package's schema and completed with its defaults, and every checkpoint it
# names resolved from the catalogues, before any work.
try:
    config.update(anisweep_config.complete(config))
    CHECKPOINTS = {c.key: c for c in anisweep_config.checkpoints(config)}
    # A saved local run's config.json files (one architecture; each step against the extract settings), read now as
    # a toy's spec is: no job runs before them.
    check_local_runs(CHECKPOINTS.values(), config)
    # Each Hub model's published grid audited from file metadata (anisweep.checkpoints.sweep_audit): its health
    # printed, and under audit.flagged: skip the steps whose weights are another branch's, or that have none, left
    # out of the run (the sweep lists them). results/{family}/{model}/grid.parquet is written when the run starts
    # (onstart below), never while the workflow is read; a job re-reads the table.
    AUDIT = sweep_audit.plan(CHECKPOINTS.values(), config["audit"], refresh=workflow.is_main_process)
    CHECKPOINTS = {key: c for key, c in CHECKPOINTS.items() if key not in AUDIT.skipped}
    # untrained.inits with each swept-model init completed to {family, model, step} (anisweep.mechanism.untrained_inits)
    UNTRAINED_INITS = (
        untrained_inits.resolve(config["untrained"]["inits"], CHECKPOINTS.values())
        if config["untrained"]["enabled"]
        else []
    )
except (ConfigError, AuditError) as error:
    raise WorkflowError(f"config: {error}") from None

MODELS = anisweep_config.models(config)

# The user's measures (config `measures:` and installed packages' entry points, anisweep.measures.registry), imported
# now so that an entry that does not import stops the run before any job, naming it (and, for an installed package's,
# the package and how to leave it out). A table measure runs in its own job per checkpoint (rule table_measure), a
# stream measure in extract's; both tables join metrics.parquet.
try:
    MEASURES = {m.name: m for m in user_measures(config["measures"], config["installed_measures"])}
except InstalledMeasureError as error:
    raise WorkflowError(str(error)) from None
except MeasureError as error:
    raise WorkflowError(f"config: {error}") from None
TABLE_MEASURES = {name: m for name, m in MEASURES.items() if m.kind == "table"}
STREAM_MEASURES = {name: m for name, m in MEASURES.items() if m.kind == "stream"}
LIVE_MODELS = [
    *anisweep_config.live_local_runs(config),
    *(name for name in config.get("toy", {}) if anisweep_config.toy_spec(config, name).get("live")),
]
if STREAM_MEASURES and LIVE_MODELS:
    raise WorkflowError(
        f"config: stream measures {sorted(STREAM_MEASURES)} run in extract's forward pass, which the live models "
        f"{LIVE_MODELS} have none of (their tables come from the training callback): sweep their saved checkpoints "
        "(live: false), or make the measure a table measure"
    )


# The identity of each stream measure's code (its content, never its path), recorded in one file that extract reads,
# written by its own job (stream_measure_code in extract.smk) and never while the workflow is read. The job's param
# is the record (anisweep.measures.stale.code_record), which changes when a stream measure is new or its code
# changed, so that editing one reruns extract (the file is newer than extract's tables) and removing one reruns
# nothing (the record, and extract's inputs, stay as they were). A dry run writes nothing.
STREAM_MEASURE_CODE = "resources/stream_measure_code.json"
STREAM_MEASURE_RECORD = code_record(STREAM_MEASURE_CODE, {name: m.code_identity for name, m in STREAM_MEASURES.items()})


def stream_measure_code(wildcards):
    return [STREAM_MEASURE_CODE] if STREAM_MEASURE_RECORD else []


def measure_tables(wildcards):
    """A checkpoint's tables of the user's measures, which its metrics join."""
    folder = f"results/{wildcards.family}/{wildcards.model}/step{wildcards.step}/measures"
    joined = [name for name, m in MEASURES.items() if m.kind != "comparative"]  # those of pairs: compare.smk
    return [f"{folder}/{name}.parquet" for name in joined] + weight_tables(wildcards)  # weights.smk


def check_device(device):
    """A GPU the config asks for and the machine that runs the jobs lacks stops the run before any job (on a
    cluster the job itself checks, naming its node). Called on start, so that a dry run is not stopped."""
    if device != "cuda" or not workflow.local_exec:
        return
    from anisweep.extract.device import DeviceUnavailable, torch_device

    try:
        torch_device(device)
    except DeviceUnavailable as error:
        raise WorkflowError(f"config: {error}") from None


def cancel_rescheduling_timers():
    """Cancel the scheduler's pending re-evaluation timers, so that a finished run exits at once.

    Snakemake's job rate limiter (max-jobs-per-timespan) ends every scheduling round with a timer that starts
    another round after the timespan (one pending at a time: OneReevaluationTimer). The workstation profile
    (profiles/default) sets a 10 s timespan instead of 1 s; the timer left when the run ends would otherwise hold
    the process for up to 10 s. It only wakes a scheduler that has returned."""
    for thread in threading.enumerate():
        if isinstance(thread, threading.Timer):
            thread.cancel()


class OneReevaluationTimer:
    """The scheduler's re-evaluation after the rate limiter's timespan, with at most one timer pending.

    Snakemake ends every scheduling round with a timer that starts another round after the timespan, so each
    finished job starts a chain of rounds of its own: by a sweep's end, one round a second per 10 finished jobs,
    each stat-ing every ready job's inputs. One pending timer wakes the scheduler as often as the rate limiter
    needs (a job it held back waits at most two timespans), whatever the number of jobs that finished. An internal
    API: where the scheduler lacks it, its own timers stay."""

    def __init__(self, scheduler):
        self.scheduler = scheduler
        self.lock = threading.Lock()
        self.pending = False

    def __call__(self, delay):
        with self.lock:
            if self.pending:
                return
            self.pending = True
        threading.Timer(delay, self.reevaluate).start()

    def reevaluate(self):
        with self.lock:
            self.pending = False  # before the round it starts, so that the round schedules the next timer
        self.scheduler._open_jobs.release()

    @classmethod
    def install(cls, scheduler):
        if hasattr(scheduler, "_schedule_reevalutation") and hasattr(scheduler, "_open_jobs"):
            scheduler._schedule_reevalutation = cls(scheduler)


class FunctionSignatures:
    """Snakemake's lookup of a function's parameters (which of wildcards, input, attempt ... it takes), read once per
    function instead of once per job: Snakemake reads the signature of every input, params and resources function
    of a rule again for each of its jobs (inspect.signature, 25 a job; about a tenth of planning's CPU), and a
    function's signature never changes. Plain functions and bound methods alone, which the rules hold for the whole
    run; anything else is looked up as before. An internal API: where Snakemake lacks it, its own lookups stay."""

    MODULES = ("snakemake.common", "snakemake.rules", "snakemake.jobs")

    def __init__(self, lookup):
        self.lookup, self.known = lookup, {}

    def __call__(self, func):
        if not isinstance(func, (FunctionType, MethodType)):
            return self.lookup(func)
        params = self.known.get(func)
        if params is None:
            params = self.known[func] = self.lookup(func)
        return params

    @classmethod
    def install(cls):
        modules = [sys.modules.get(name) for name in cls.MODULES]
        lookup = getattr(modules[0], "get_function_params", None)
        if lookup is None or isinstance(lookup, cls):
            return
        cached = cls(lookup)
        for namespace in modules:
            if getattr(namespace, "get_function_params", None) is lookup:
                namespace.get_function_params = cached


FunctionSignatures.install()


onstart:
    check_device(config["extract"]["device"])
    AUDIT.write_grids()
    OneReevaluationTimer.install(workflow.scheduler)


def check_architectures(checkpoints):
    """A local run whose config.json no adapter knows stops the workflow before any job, naming the supported
    architectures (the Hub families are known ones; toys are built by the workflow); so does a `hub` checkpoint
    whose config.json the Hugging Face cache holds, or that needs remote code its entry does not allow (else its
    fetch checks the config.json before any weight); and so does such a config.json of a model that reads another
    modality than the corpus holds (text, images, audio), before the corpus step downloads a dataset."""
    for c in checkpoints:
        if c.family == HubRepo.family:
            hf = HubRepo.cached_config(c)
            try:
                if hf is not None:
                    check_hub_config(hf, c.trust_remote_code, c.key)
                    check_corpus_modality(hf, config["corpus"], c.key)
            except PreflightError as error:
                raise WorkflowError(f"config: {error}") from None
            continue
        path = Path(c.path or "") / "config.json"
        if c.family != "local" or not path.is_file():
            continue  # a missing config.json is fetch's error, for that checkpoint alone
        hf = json.loads(path.read_text())
        try:
            adapter_for(SimpleNamespace(model_type=hf.get("model_type"), architectures=hf.get("architectures")))
            check_corpus_modality(hf, config["corpus"], c.key)
        except UnsupportedArchitecture as error:
            raise WorkflowError(f"config: {c.key}: {error}") from None
        except PreflightError as error:
            raise WorkflowError(f"config: {error}") from None


check_architectures(CHECKPOINTS.values())


# The package code that a job runs is an input of its rule, so editing that code reruns it (Snakemake's mtime
# trigger), derived from the import graph of the module its command runs and of its stage's commands module
# (anisweep.code_inputs). Fetch and extract have none, since the model runs are the cost; a change to the code that
# runs a model takes --forcerun.
ANALYSIS_CODE = {
    "metrics": code_inputs("measures.metrics", "measures.spectra", commands="cli.measures"),
    "sweep": code_inputs("measures.sweep", commands="cli.measures"),
    "phases": code_inputs("measures.phases", commands="cli.measures"),
    "plots": code_inputs("plots.sweep", commands="cli.plots"),
    "plot_families": code_inputs("plots.families", commands="cli.plots"),
    "plot_survey": code_inputs("plots.survey", commands="cli.plots"),
    "explore": code_inputs("explore.data", "explore.page", commands="cli.explore"),
    "untrained": code_inputs("mechanism.untrained", commands="cli.mechanism"),
    "untrained_plots": code_inputs("plots.untrained", commands="cli.plots"),
    "qk_svd": code_inputs("mechanism.qk_svd", "plots.distributions", commands="cli.mechanism"),
    "score_hist": code_inputs("plots.distributions", commands="cli.plots"),
    "spectra": code_inputs("plots.spectra", commands="cli.plots"),
    "plot_phases": code_inputs("plots.phases", commands="cli.plots"),
    "fixed_bases": code_inputs("tangent.fixed", commands="cli.tangent"),
    "fixed_shares": code_inputs("tangent.analysis", commands="cli.tangent"),
    "gradients": code_inputs("tangent.analysis", commands="cli.tangent"),
    "gradients_sweep": code_inputs("tangent.sweep", commands="cli.tangent"),
    "plot_gradients": code_inputs("plots.gradients", commands="cli.plots"),
    "measure": code_inputs("measures.registry", commands="cli.measures"),
    "plot_measure": code_inputs("plots.measures", commands="cli.plots"),
    "glossary": code_inputs("measures.glossary", commands="cli.measures"),
}


def untracked(value):
    """A param that Snakemake does not record (it records no param whose function takes `input`), so that changing
    it reruns nothing: how a job runs (the device, the batch size, retries), never what it writes."""
    return lambda wildcards, input: value(wildcards) if callable(value) else value


def settings_of(section, keys):
    """The config section's settings `keys` (completed with the schema's defaults) as JSON with sorted keys: the
    recorded params of a rule, so that reordering the config or writing a default out reruns nothing."""
    return shlex.quote(json.dumps({key: section[key] for key in sorted(keys)}, sort_keys=True))


# Every rule's command line starts with {params.cli}: untracked, so that another interpreter or checkout path
# reruns nothing. The rules whose figures are in the report write it into their command instead (their parameters
# panel shows the figure's settings only): another interpreter or checkout redraws those figures.
CLI = untracked(ANISWEEP)
ANISWEEP_IN_SHELL = ANISWEEP.replace("{", "{{").replace("}", "}}")

# The extract settings that change extract's tables: device, attention and batch_size choose how the same
# numbers are computed (to rounding), and max_unknown_token_share only whether a run may start, so changing them
# reruns nothing (--forcerun extract to redo the model runs). sample_precision float32 is what a package without the
# setting stored: left out of the params, so that results written before it keep theirs.
EXTRACT_OUTPUT_KEYS = sorted(
    set(config["extract"])
    - {"device", "attention", "batch_size", "max_unknown_token_share"}
    - ({"sample_precision"} if config["extract"]["sample_precision"] == "float32" else set())
)


def on_failure(rule):
    """The params of the rules without figures in the report, untracked (editing it reruns nothing). The suffix
    after `2> {log}` (anisweep.job_failure) that repeats the cause on the console when the command fails: the last
    line of its log, or, where it could not write one (a full disk), that it wrote none and the free space there;
    a kill by a signal named; the command's status kept. The per-checkpoint commands start their line with
    `{family}/{model}/step{N}: ` themselves; for the other rules it is prefixed with the job's name (`corpus:
    UnicodeDecodeError: ...`, `sweep toy/toy-neox: ValueError: ...`)."""

    def suffix(wildcards, input):
        log = shlex.quote(str(getattr(rules, rule).log[0]).format(**dict(wildcards.items())))
        if "step" in wildcards.keys():
            key = f"{wildcards.family}/{wildcards.model}/step{wildcards.step}"
            return failure_suffix(log, shlex.quote(key), name_in_line=False)
        name = " ".join([rule, "/".join(value for _, value in wildcards.items())]).strip()
        return failure_suffix(log, shlex.quote(name), name_in_line=True)

    return suffix


def figure_command(command, rule, *wildcards):
    """The `shell:` text of each figure job in the report: the CLI `command` (Snakemake's fields in it), its stderr
    to its log and the failure suffix written into the text, not passed as params, so that the figure's parameters
    panel in the report shows its settings only; `wildcards`, the rule's, in its output's order, name the job in
    the cause line."""
    fields = [f"{{wildcards.{name}:q}}" for name in wildcards]
    key = f"{rule}' '{'/'.join(fields)}" if wildcards else rule
    return f"{ANISWEEP_IN_SHELL} {command} 2> {{log:q}} {failure_suffix_template(key, name_in_line=True)}"


def sweep_of(family, model, job=None):
    """A model's sweep table for the onerror handler (anisweep.measures.partial): with the sweep `job` that was to
    write it, dropping its metadata record is one of Snakemake's internals."""
    checkpoints = model_checkpoints(family, model)
    return Sweep(
        family=family,
        model=model,
        seed=checkpoints[0].seed,
        steps=[c.step for c in checkpoints],
        metrics=[Path(f"results/{c.key}/metrics.parquet") for c in checkpoints],
        out=Path(f"results/{family}/{model}/sweep.parquet"),
        final_step=final_step_of(SimpleNamespace(family=family, model=model)),
        forget=None if job is None else (lambda: workflow.persistence.cleanup_metadata(job.output[0])),
        grid=AUDIT.grids.get((family, model)),
        flagged_steps=AUDIT.flagged_steps(family, model),
    )


def unfinished_sweeps():
    """onerror: the sweep of every sweep job the failed run had still to run, from Snakemake's DAG (an
    internal API: every model's sweep when it cannot say)."""
    try:
        pending = {
            (job.wildcards.family, job.wildcards.model): job
            for job in workflow.dag.needrun_jobs()
            if job.rule.name == "sweep"
        }
    except Exception:  # noqa: BLE001 - an internal Snakemake API: fall back to every model
        pending = dict.fromkeys(MODELS)
    return [sweep_of(family, model, job) for (family, model), job in sorted(pending.items())]


wildcard_constraints:
    family="[a-z0-9_]+",
    model="[^/]+",
    step="[0-9]+",


def checkpoint_of(wildcards):
    key = f"{wildcards.family}/{wildcards.model}/step{wildcards.step}"
    if key not in CHECKPOINTS:
        raise WorkflowError(f"{key} is not a checkpoint of this config; add its model and step under `models:`")
    return CHECKPOINTS[key]


def checkpoint_source(wildcards):
    """extract's recorded param: what the checkpoint is (anisweep.checkpoints.identity), so that a local run saved
    again into its step folders is analysed again, and a Hub branch whose weights the audit finds pushed again
    (another sha256) too."""
    chosen = checkpoint_of(wildcards)
    identity = source_identity(chosen)
    if chosen.key in AUDIT.hashes:
        identity["audited_sha256"] = AUDIT.hashes[chosen.key]
    return json.dumps(identity, sort_keys=True)


def audited_sha256(wildcards):
    """fetch's argument: the sha256 the audit found for each of the checkpoint's weight files ({} where none)."""
    return json_arg(AUDIT.hashes.get(checkpoint_of(wildcards).key, {}))


def grid_arg(wildcards):
    """The sweep's argument: the model's audited grid (written when the run starts), whose flagged steps it lists
    (none for local runs and toys). Not an input: what the sweep reads of it is its param `audit` (audit_verdict),
    so that a dry run, which writes no grid, plans what the run does."""
    path = AUDIT.grids.get((wildcards.family, wildcards.model))
    return "" if path is None else f"--audit {shlex.quote(str(path))}"


def audit_verdict(wildcards):
    """The sweep's recorded param: each of the config's steps' audit status and the branch it repeats (a digest)."""
    return AUDIT.verdict(wildcards.family, wildcards.model)


def audit_flagged(wildcards):
    """The sweep's recorded param: the config's steps the audit left out, and the seed their rows carry."""
    steps = AUDIT.flagged_steps(wildcards.family, wildcards.model)
    if not steps:
        return ""
    seed = model_checkpoints(wildcards.family, wildcards.model)[0].seed
    return f"--flagged-steps {','.join(map(str, steps))}" + ("" if seed is None else f" --seed {seed}")


def json_arg(value):
    """A value as a shell argument of JSON, its keys sorted: the same settings always give the same recorded param."""
    return shlex.quote(json.dumps(value, sort_keys=True))


def checkpoints_by_model(checkpoints):
    by_model = {}
    for c in checkpoints:
        by_model.setdefault((c.family, c.model), []).append(c)
    return by_model


# Read by input functions of every checkpoint's jobs: an index, so that planning stays linear in the checkpoints.
CHECKPOINTS_OF_MODEL = checkpoints_by_model(CHECKPOINTS.values())


def model_checkpoints(family, model):
    return list(CHECKPOINTS_OF_MODEL.get((family, model), ()))


def per_checkpoint(name, checkpoints=None):
    """Input function: the file `name` of every checkpoint of the wildcards' model, in step order (of those
    `checkpoints(family, model)` chooses; all of the model's by default)."""

    def files(wildcards):
        chosen = (checkpoints or model_checkpoints)(wildcards.family, wildcards.model)
        return [f"results/{c.key}/{name}" for c in chosen]

    return files


def model_figures(names, folder="results/{family}/{model}/figures", **where):
    """A figure rule's outputs: each figure a report() entry keyed by its name without .png, with the caption
    workflow/report/<name>.rst, filed under the family and model (or `where`)."""
    where = where or {"category": "{family}", "subcategory": "{model}"}
    return {
        name.removesuffix(".png"): report(
            f"{folder}/{name}", caption=f"../report/{name.removesuffix('.png')}.rst", **where
        )
        for name in names
    }


def figures(family, model):
    built_in = [f"results/{family}/{model}/figures/{name}" for name in MODEL_FIGURES]
    users = [f"results/{family}/{model}/figures/{f}" for m in MEASURES.values() for f in m.figures]
    return built_in + users + weight_figures(family, model)  # weights.smk


def distribution_outputs(family, model):
    """The q/k SVD table and figures of one model, its spectra figure, and its score histogram figure where extract counts the scores
    (`extract.score_bins`; workflow/rules/mechanism.smk, plots.smk)."""
    names = [*QK_SVD_FIGURES, *SPECTRA_FIGURES, *(["score_hist.png"] if config["extract"]["score_bins"] else [])]
    return [f"results/{family}/{model}/qk_svd.parquet", *(f"results/{family}/{model}/figures/{n}" for n in names)]


def all_outputs():
    outputs = []
    for family, model in MODELS:
        outputs += [f"results/{family}/{model}/sweep.parquet", f"results/{family}/{model}/phases.parquet"]
        outputs += figures(family, model) + [f"results/{family}/{model}/figures/{n}" for n in PHASES_FIGURES]
        outputs += distribution_outputs(family, model)
        outputs += compare_outputs(family, model)  # compare.smk
    families = sorted({family for family, _ in MODELS})
    for family in families:
        outputs.append(f"results/{family}/figures/compare.png")
    if len(families) > 1:
        outputs.append("results/figures/compare_families.png")
    outputs += [f"results/figures/{name}" for name in SURVEY_FIGURES]
    if config["untrained"]["enabled"]:
        outputs += [f"results/untrained/figures/{name}" for name in UNTRAINED_FIGURES]
    return outputs + gradient_outputs() + ["results/glossary.md", "results/explore.html"]


def toy_checkpoints_dir(wildcards):
    if wildcards.family == "toy":
        return f"{anisweep_config.TOY_ROOT}/{wildcards.model}"
    return []


def final_step_of(wildcards):
    return final_step(model_checkpoints(wildcards.family, wildcards.model))


# Resources for cluster runs (profiles/slurm, docs/slurm.md): a GPU only when the config asks for cuda, memory
# and wall time from the model's size, so that one profile fits pythia-14m and pythia-12b. Retries double both.
EXTRACT_GPU = 1 if config["extract"].get("device") == "cuda" else 0


def extract_params_m(wildcards):
    """Millions of parameters, from the family's catalogue (override with set-resources in the profile)."""
    return params_millions(checkpoint_of(wildcards))


def extract_mem_mb(wildcards, attempt):
    bytes_per_param = 4 if config["extract"].get("dtype", "float32") == "float32" else 2
    return int((2000 + 2.5 * bytes_per_param * extract_params_m(wildcards)) * attempt)


def extract_runtime(wildcards, attempt):
    params_per_minute = 200 if EXTRACT_GPU else 50  # millions of parameters through the forward passes a minute
    return int((15 + extract_params_m(wildcards) / params_per_minute) * attempt)
