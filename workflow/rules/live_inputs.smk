# The take steps of runs analysed while they trained (their rules: workflow/rules/live.smk).
from anisweep.checkpoints.identity import folder_content
from anisweep.checkpoints.local import extract_names


def live_names(wildcards):
    """The files a live step's take copies: extract's, and the backward pass's where the analysis covers it."""
    pass_files = [f"{name}.parquet" for name in GRADIENT_PASS_TABLES] if covered(wildcards) else []
    return ",".join([*extract_names(), *pass_files])


def live_empty(wildcards):
    """The backward pass's tables of a step the analysis does not cover: written without rows where missing."""
    if covered(wildcards) or not GRADIENT_PASS_TABLES:
        return ""
    return f"--empty {','.join(f'{name}.parquet' for name in GRADIENT_PASS_TABLES)}"


def live_local_content(wildcards):
    """extract_live_local's recorded param: the content of the step folder the callback wrote, so that a step it
    wrote again is taken again (anisweep.checkpoints.identity)."""
    folder = Path(LIVE_LOCAL_RUNS[wildcards.model]) / f"step{wildcards.step}"
    return json.dumps(folder_content(folder, live_names(wildcards).split(",")), sort_keys=True)
