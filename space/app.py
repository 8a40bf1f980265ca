"""hfexport Space: convert a Hub model with its owner's recipe, check parity, download or open a pull request.

A thin Gradio layout. Everything it does goes through hfexport's APIs: recipes (`hfexport.recipe.validation`), proposals for
models without one (`hfexport.job.propose`), jobs (`hfexport.job.run.run_job`), publishing (`hfexport.publication.publish`), and the
Space's own non-UI logic (`hfexport.surfaces.space`: session folders, one job at a time, error categories and the
reproducing `hfexport` command). Run it locally against any Hub endpoint: see README.md in this folder.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import gradio as gr
from hfexport.files import RECIPE_FILE
from hfexport.latency import chart_rows
from hfexport.layout import format_label
from hfexport.recipe.validation import canonical_json
from hfexport.report.markdown import report_markdown
from hfexport.surfaces import space as logic
from hfexport.surfaces.failure import describe_failure

TITLE = "hfexport: export a Hub model the way its owner says"
INTRO = (
    "Sign in, enter a model repo, and **Convert**: the model's own recipe (`export_config.json`) decides the "
    "formats and settings; every artifact is reloaded and checked against the model before you get it. "
    "**Open PR** publishes the artifacts to the model repo as one pull request, updated in place on later runs."
)
# Each format under its one name (`format_label`, as the report, the card and the CLI say it).
FORMAT_CHOICES = [(format_label(name), name) for name in ("onnx", "openvino", "executorch", "dynamo")]
IDLE = "Conversions run one at a time; while yours waits, its place in the queue shows here."
CSS = """
.problem-lines { font-family: var(--font-mono); white-space: pre; }
/* Results and report tables keep their rows on one line and scroll sideways in their own box on a narrow screen
   (a phone), instead of wrapping one character per line or cutting the bar column off. */
#outcome table, #results table, #pr-result table, #recipe-status table {
  display: block; width: max-content; max-width: 100%; overflow-x: auto; -webkit-overflow-scrolling: touch; }
#outcome th, #outcome td, #results th, #results td { white-space: nowrap; }
#outcome, #results, #progress, #recipe-status, #pr-result { overflow-wrap: anywhere; min-width: 0; }
"""


SIGNED_OUT_MODE = ("**Signed out**: this local run has no Hugging Face login. Load and check recipes here; to "
                   "convert and open pull requests, restart with `HF_TOKEN=hf_... python space/app.py`.")
# What the page keeps in the browser (localStorage) so that signing in, which reloads the page, loses nothing.
SAVED = {"model": "", "revision": "", "recipe": ""}
NO_RESULTS = "Nothing converted yet for this model."


def _new_state() -> dict:
    return {"session": None, "model": None, "revision": None, "repo_recipe": None, "loaded_text": None,
            "output": None, "targets": [], "left_out": [], "edited": False, "zip": None, "status": None,
            "verified": None, "recipe_valid": False, "recipe_source": None, "pr": None, "fit": None,
            "sample_kinds": [], "samples": {}}


def _forget_results(state: dict) -> dict:
    """The state with the previous model's job dropped: its report, zip and what Open PR would publish."""
    return {**state, "output": None, "zip": None, "status": None, "verified": None, "targets": [], "left_out": [],
            "latency": [], "report": None, "failure": None, "pr_url": None}


def _token(oauth_token: gr.OAuthToken | None, settings: logic.SpaceSettings) -> str | None:
    return logic.hub_token(oauth_token.token if oauth_token else None, settings)


def _fail(error: BaseException, command: str | None = None) -> str:
    return describe_failure(error, command).markdown()


def build_app(settings: logic.SpaceSettings | None = None, sign_in: bool = True) -> gr.Blocks:
    """The Blocks of the Space (queue not yet configured; `launch` does that). `sign_in=False`: no sign-in button
    (a local run without a Hugging Face login, where Gradio's mocked sign-in cannot work): recipes only."""
    settings = settings or logic.SpaceSettings.from_env()
    workspace = logic.Workspace(settings.workdir, settings.session_ttl_s)
    runner = logic.JobRunner(settings)
    conversions = logic.Conversions()  # each session's running conversion: what Cancel stops, what Load waits for

    def release(state: Any) -> None:
        if isinstance(state, dict) and state.get("session"):
            workspace.release(state["session"])

    # ── handlers ─────────────────────────────────────────────────────────────

    def show_user(profile: gr.OAuthProfile | None):
        if not sign_in:
            return SIGNED_OUT_MODE
        if profile is None:
            return "Not signed in: you can read public recipes; **sign in** to convert and open pull requests."
        return f"Signed in as **{profile.username}**."

    def guard_load(model_id: str, request: gr.Request):
        """Loading another model while this session's conversion runs is refused, saying so: the model box goes
        back to the model being converted (its results, zip and PR buttons belong to it)."""
        conversion = conversions.running(_session(request))
        refusal = logic.load_refusal(conversion, model_id)
        if refusal is None:
            return gr.update(), ""
        return conversion.model, refusal

    def load_model(model_id: str, revision: str, state: dict | None, oauth_token: gr.OAuthToken | None,
                   request: gr.Request = None):
        """Fetch the repo's recipe and validate it; without one, draft a recipe for the chosen formats."""
        if conversions.running(_session(request)) is not None:  # refused by `guard_load`: the page stays as it is
            return (gr.skip(),) * 6
        state = dict(state or _new_state())
        try:
            model = logic.check_model_id(model_id)
            rev = logic.check_revision(revision)
            fetched = logic.fetch_recipe(model, rev, _token(oauth_token, settings))
        except Exception as error:  # noqa: BLE001 - shown as a category + command, never a traceback
            command = logic.validate_command((model_id or "").strip() or "MODEL", (revision or "").strip() or None)
            state = {**_forget_results(state), "model": None, "revision": None, "repo_recipe": None,
                     "loaded_text": None, "recipe_valid": False, "recipe_source": None, "pr": None,
                     "model_config": None, "fit": None, "sample_kinds": [], "samples": {}}
            return (_fail(error, command), "", gr.update(value=[], visible=False),
                    gr.update(choices=[], value=[]), gr.update(visible=False), state)
        state = _forget_results(state)
        state.update(model=model, revision=rev, repo_recipe=None, loaded_text=fetched.text, recipe_valid=False,
                     recipe_source=None, pr=logic.open_pr_number(model, _token(oauth_token, settings)),
                     model_config=fetched.config, fit=None, samples={},
                     sample_kinds=logic.sample_kinds(model, rev, _token(oauth_token, settings)))
        if fetched.check is None:  # no recipe: offer formats and a draft
            status = (f"**No recipe in `{model}`.** Pick formats below: the recipe proposed for them is in the "
                      "editor. Edit it, **Convert** to try it, then **Propose recipe** to open a pull request "
                      f"that adds `{RECIPE_FILE}`.\n\n")
            try:
                draft = logic.draft_recipe(model, rev, ["onnx"], _token(oauth_token, settings))
            except Exception as error:  # noqa: BLE001
                return (status + _fail(error, logic.init_command(model, ["onnx"], rev)), "",
                        gr.update(value=[], visible=False), gr.update(choices=[], value=[]), gr.update(visible=True),
                        state)
            check = draft.check
            state.update(recipe_valid=check.valid, recipe_source="proposed", loaded_text=draft.text)
            return (status + (draft.note or check.markdown()), draft.text, _problems(check), _target_update(check),
                    gr.update(visible=True), state)
        check = fetched.check
        state.update(recipe_valid=check.valid, recipe_source="repo", fit=None)
        if check.valid:
            state["repo_recipe"] = canonical_json(check.document)
            fit = logic.jobs_fit(model, rev, _token(oauth_token, settings))
            state["fit"] = {"memory": fit.memory, "available": fit.available}
        status = f"Recipe from `{fetched.source}`\n\n{check.markdown()}"
        return (status, fetched.text, _problems(check), _target_update(check), gr.update(visible=False), state)

    def search(query: str, oauth_token: gr.OAuthToken | None):
        """The Hub's models matching `query`, to pick one into the model box."""
        try:
            found = logic.find_models(query, _token(oauth_token, settings))
        except Exception as error:  # noqa: BLE001
            return gr.update(choices=[], value=None, visible=False), _fail(error)
        note = "" if found or not (query or "").strip() else f"No model matches `{query.strip()}`."
        return gr.update(choices=found, value=None, visible=bool(found)), note

    def draft(model_id: str, revision: str, formats: list[str], state: dict | None,
              oauth_token: gr.OAuthToken | None):
        state = dict(state or _new_state())
        try:
            model = logic.check_model_id(model_id)
            rev = logic.check_revision(revision)
            result = logic.draft_recipe(model, rev, formats or ["onnx"], _token(oauth_token, settings))
        except Exception as error:  # noqa: BLE001
            return (_fail(error, logic.init_command((model_id or "MODEL").strip(), formats)), gr.update(),
                    gr.update(), gr.update(), state)
        check = result.check
        state.update(recipe_valid=check.valid, recipe_source="proposed", loaded_text=result.text)
        return (result.note or check.markdown()), result.text, _problems(check), _target_update(check), state

    def validate(text: str, state: dict | None):
        check = logic.check_recipe_text(text, config=(state or {}).get("model_config"))
        state = {**(state or _new_state()), "recipe_valid": check.valid}
        return check.markdown(), _problems(check), _target_update(check), state

    def add_variants(kinds: list[str], recipe_text: str, ticked: list[str], state: dict | None):
        """The ticked quantized variants added to the editor's recipe as targets (the unticked ones taken out), and
        ticked to convert: what is converted is what the editor shows."""
        state = dict(state or _new_state())
        check = logic.check_recipe_text(recipe_text, config=state.get("model_config"))
        if not check.valid:
            return ("Fix the recipe's problems to add quantized variants.\n\n" + check.markdown(), gr.update(),
                    _problems(check), gr.update(), gr.update(value=[]), state)
        try:
            document = logic.with_quantized_variants(check.document, kinds or [])
        except Exception as error:  # noqa: BLE001
            return _fail(error), gr.update(), gr.update(), gr.update(), gr.update(), state
        text = logic.pretty_json(document)[0]
        check = logic.check_recipe_text(text, config=state.get("model_config"))
        state["recipe_valid"] = check.valid
        added = logic.variant_targets(document, kinds or [])
        keep = [name for name in ticked or [] if name in check.targets]
        value = list(dict.fromkeys((keep or [check.recipe.default_target] if check.valid else []) + added))
        note = f"Quantized variants in the editor's recipe: {', '.join(f'`{n}`' for n in added)}.\n\n" if added else ""
        targets_update = gr.update(choices=check.targets, value=value) if check.valid else _target_update(check)
        return note + check.markdown(), text, _problems(check), targets_update, gr.update(), state

    def offer_variants(recipe_text: str, state: dict | None):
        """The quantized variants the editor's recipe can take (ticked: those it holds); hidden when none, and while
        the recipe does not validate against the loaded model."""
        check = logic.check_recipe_text(recipe_text, config=(state or {}).get("model_config"))
        choices = logic.quantized_variant_choices(check.document) if check.valid else []
        return gr.update(choices=choices, value=logic.ticked_variants(check.document) if choices else [],
                         visible=bool(choices))

    def offer_samples(state: dict | None):
        """An upload area per kind of sample the loaded model's processor takes (an image, a WAV clip), empty: a
        newly loaded model starts from the recipe's own samples."""
        kinds = (state or {}).get("sample_kinds") or []
        note = ""
        if kinds:
            what = " or ".join("an image" if kind == "image" else "a WAV clip" for kind in kinds)
            note = (f"This model's processor takes {what}: upload your own (optional) and Convert traces and "
                    "verifies the export on it instead of the recipe's synthesized samples.")
        return (gr.update(visible="image" in kinds, value=None), gr.update(visible="audio" in kinds, value=None),
                note)

    def take_sample(kind: str):
        def take(path: str | None, state: dict | None):
            """Check the visitor's upload (type, size, decodes): kept for Convert, or refused with the reason and
            the upload area emptied, so no conversion runs on a file that cannot be used."""
            state = dict(state or _new_state())
            samples = {key: value for key, value in (state.get("samples") or {}).items() if key != kind}
            try:
                sample = logic.check_sample(path, kind)
            except Exception as error:  # noqa: BLE001 - a category and one line naming the file, never a traceback
                note = f"{_fail(error)}\n\nUpload another file, or Convert with the recipe's own samples."
                return gr.update(value=None), note, {**state, "samples": samples}
            if sample is not None:
                samples[kind] = {"path": str(path), "describe": sample.describe()}
            return gr.update(), logic.sample_markdown(samples), {**state, "samples": samples}

        return take

    def controls(state: dict | None, recipe_text: str | None, oauth_token: gr.OAuthToken | None):
        """Convert enabled only when it can succeed (with the reason beside it when not); Open PR enabled only with
        something to publish, and named "Update PR #N" once the model has an hfexport pull request. "Run on my
        Hugging Face Jobs" is the primary action when the preflight's estimate does not fit this Space."""
        token = _token(oauth_token, settings)
        blocker = logic.convert_blocker(state, token)
        jobs_blocker = logic.jobs_blocker(state, token, settings, recipe_text)
        fit = logic.JobsFit(**(state or {}).get("fit")) if (state or {}).get("fit") else None
        too_large = fit is not None and not fit.fits
        return (gr.update(interactive=blocker is None, variant="secondary" if too_large else "primary"),
                blocker or "",
                gr.update(interactive=logic.can_publish(state), value=logic.pr_button_label(state)),
                gr.update(interactive=logic.can_publish(state)),
                gr.update(interactive=jobs_blocker is None, variant="primary" if too_large else "secondary"),
                jobs_blocker or (fit.markdown() if fit else ""),
                gr.update(interactive=logic.propose_blocker(state, token) is None))

    def run_jobs(model_id: str, revision: str, recipe_text: str, targets: list[str], state: dict | None,
                 oauth_token: gr.OAuthToken | None):
        """Export and publish as a Hugging Face Job under the signed-in user's account: its state and logs as it
        runs, then the pull request it opened."""
        state = dict(state or _new_state())
        command = logic.export_command((model_id or "MODEL").strip(), (revision or "").strip() or None, targets,
                                       push=True)
        try:
            model = logic.check_model_id(model_id)
            rev = logic.check_revision(revision)
            token = logic.require_token(_token(oauth_token, settings), "run on your Hugging Face Jobs")
            blocker = logic.jobs_blocker(state, token, settings, recipe_text)
            if blocker:
                raise logic.SpaceError("Cannot run on Hugging Face Jobs", blocker)
            yield "Starting a Hugging Face Job…", state
            for update in logic.run_on_jobs(model, rev, targets or [], token, settings):
                if update.finished and update.pr_num:
                    state = {**state, "pr": update.pr_num}
                yield update.markdown(), state
        except Exception as error:  # noqa: BLE001
            yield _fail(error, command), state

    def convert(model_id: str, revision: str, recipe_text: str, targets: list[str], state: dict | None,
                oauth_token: gr.OAuthToken | None, request: gr.Request):
        """Run the job for the chosen targets with live progress; end with the report and a zip of the artifacts."""
        state = dict(state or _new_state())
        state.update(output=None, zip=None, status=None, verified=None, latency=[], report=None, failure=None)
        try:
            model = logic.check_model_id(model_id)
            rev = logic.check_revision(revision)
            token = logic.require_token(_token(oauth_token, settings), "convert models")
            recipe, edited = logic.recipe_for_job(recipe_text, state.get("repo_recipe") if state.get("model") == model
                                                  else None)
        except Exception as error:  # noqa: BLE001
            edited = bool((recipe_text or "").strip()) and (recipe_text or "").strip() != (state.get("loaded_text") or
                                                                                          "").strip()
            command = logic.export_command((model_id or "MODEL").strip(), (revision or "").strip() or None, targets,
                                           edited_recipe=edited)
            yield "", _fail(error, command), "", None, gr.update(interactive=False), state
            return
        session = _session(request) or "api"
        state["session"] = session
        conversion = conversions.start(session, model)
        try:
            yield from _convert(model, rev, token, recipe, edited, recipe_text, targets, state, session, conversion)
        finally:
            conversions.end(session, conversion)

    def _convert(model: str, rev: str | None, token: str, recipe: dict | None, edited: bool, recipe_text: str,
                 targets: list[str], state: dict, session: str, conversion: logic.Conversion):
        folder = workspace.new_job(session)
        samples = (state.get("samples") or {}) if state.get("model") == model else {}
        try:
            staged = logic.stage_samples(samples, folder)
        except Exception as error:  # noqa: BLE001 - e.g. the upload expired from Gradio's cache: upload it again
            workspace.release(session)
            yield "", _fail(error), "", None, gr.update(interactive=False), state
            return
        proposed = state.get("recipe_source") == "proposed" and (recipe_text or "").strip() == (
            state.get("loaded_text") or "").strip()
        job = logic.JobRequest(model=model, output=folder / "out", targets=list(targets or []), revision=rev,
                               token=token, recipe=recipe, recipe_origin="proposed" if proposed else "edited",
                               sample_files=staged)
        log = logic.ProgressLog(f"Converting `{model}`" + (f" at `{rev}`" if rev else "") + "".join(
            f" on your sample {kind} {entry['describe']}" for kind, entry in samples.items()))
        yield log.markdown(), "", "", None, gr.update(interactive=False), state
        for event in runner.run(job, cancel=conversion.cancel):
            if isinstance(event, logic.Finished):
                break
            log.add(event)
            yield log.markdown(), "", "", None, gr.update(interactive=False), state
        cancelled = event.failure is not None and event.failure.category == "Cancelled"
        log.note = f"{'Cancelled after' if cancelled else 'Finished in'} {event.seconds:.1f} s."
        if event.report is None:
            workspace.release(session)
            yield log.collapsed(), event.failure.markdown(), "", None, gr.update(interactive=False), state
            return
        report = event.report
        zip_path = None
        if logic.publishable_targets(report):  # a job where nothing passed offers nothing to download
            try:
                zip_path = logic.zip_artifacts(job.output, folder / f"{model.replace('/', '--')}-exports.zip")
            except OSError as error:  # e.g. the disk filled up: the report is still worth showing
                workspace.release(session)
                yield log.collapsed(), _fail(error, job.command), report_markdown(report), None, \
                    gr.update(interactive=False), state
                return
        used = recipe if recipe is not None else json.loads(state["repo_recipe"]) if state.get("repo_recipe") else None
        publishable = logic.publishable_targets(report)
        # Convert clicked before this model's load finished: the state is the previous model's, so its PR is too.
        pr = state.get("pr") if state.get("model") == model else logic.open_pr_number(model, token)
        state.update(model=model, revision=rev, output=str(job.output), targets=publishable, edited=edited, pr=pr,
                     latency=chart_rows(report),
                     left_out=[name for name in report.targets if name not in publishable],
                     zip=str(zip_path) if zip_path else None, status=report.status,
                     verified=logic.verified_recipe(used, report), report=report,
                     failure=event.failure.markdown() if event.failure is not None else None)
        # The zip's value only (the API returns it as a path); `idle` shows the area once there is one.
        yield (log.collapsed(), _outcome(state), report_markdown(report), str(zip_path) if zip_path else None,
               gr.update(interactive=logic.can_publish(state)), state)

    def open_pr(state: dict | None, oauth_token: gr.OAuthToken | None):
        """Publish the converted artifacts as the model's one hfexport pull request (opened, updated or unchanged)."""
        state = state or _new_state()
        model = state.get("model") or "MODEL"
        command = logic.export_command(model, state.get("revision"), state.get("targets") or [],
                                       edited_recipe=bool(state.get("edited")), push=True,
                                       samples={kind: logic.display_name(entry["path"])
                                                for kind, entry in (state.get("samples") or {}).items()})
        try:
            token = logic.require_token(_token(oauth_token, settings), "open pull requests")
            result = logic.publish_job(state, token)
        except Exception as error:  # noqa: BLE001
            return _fail(error, command), state
        left_out = state.get("left_out") or []
        note = f" Not published: {', '.join(f'`{name}`' for name in left_out)} (did not pass)." if left_out else ""
        state = {**state, "pr": getattr(result, "pr_num", None) or state.get("pr"),
                 "pr_url": getattr(result, "pr_url", None) or state.get("pr_url")}
        return logic.publish_message(result) + note, state

    def publish_new(state: dict | None, profile: gr.OAuthProfile | None, oauth_token: gr.OAuthToken | None):
        """Publish the converted artifacts as one commit to a repo of the signed-in user (created when missing)."""
        state = state or _new_state()
        model = state.get("model") or "MODEL"
        try:
            token = logic.require_token(_token(oauth_token, settings), "publish to your repo")
            if profile is None:
                raise logic.SpaceError("Sign in required", "sign in with Hugging Face to publish to your repo")
            result = logic.publish_job(state, token, repo=logic.new_repo_name(profile.username, model))
        except Exception as error:  # noqa: BLE001
            return _fail(error, logic.export_command(model, state.get("revision"), state.get("targets") or []))
        return logic.publish_message(result)

    def propose(model_id: str, recipe_text: str, state: dict | None, oauth_token: gr.OAuthToken | None):
        """Open a pull request that adds the editor's (validated) recipe as `export_config.json`."""
        command = logic.validate_command((model_id or "MODEL").strip())
        try:
            model = logic.check_model_id(model_id)
            token = logic.require_token(_token(oauth_token, settings), "propose a recipe")
            check = logic.check_recipe_text(recipe_text)
            if not check.valid:  # the editor's text, not the repo's recipe: validate that file locally
                command = f"{logic.validate_command(RECIPE_FILE)}  # the editor's text, saved as {RECIPE_FILE}"
                raise logic.RecipeError(check.problems, "the editor")
            verified = (state or {}).get("verified") if (state or {}).get("model") == model else None
            document, validated = logic.finalize_proposal(check.document, verified)
            message = logic.propose_recipe(model, document, token).markdown()
        except Exception as error:  # noqa: BLE001
            return _fail(error, command)
        if validated:
            return message + " Every target passed parity here, so it records `validated_with`."
        return message + " Not every target was converted and verified here: no `validated_with` recorded."

    def cancel_conversion(request: gr.Request):
        """Stop this session's running conversion (Convert's handler then ends it as "Cancelled")."""
        conversions.cancel(_session(request))
        return gr.update(interactive=False, value="Cancelling…")

    def forget_results(request: gr.Request):
        """Another model (or none) is loading: the previous model's report, zip, Open PR and messages go, and
        Convert waits for the new recipe. Nothing goes while a conversion runs (`guard_load` refused the load)."""
        if conversions.running(_session(request)) is not None:
            return (gr.skip(),) * 11
        return (IDLE, "", "", gr.update(value=None, visible=False), gr.update(interactive=False, value="Open PR"), "",
                gr.update(value=None, visible=False), "", gr.update(interactive=False), gr.update(interactive=False),
                "")

    def busy():
        """A conversion was asked for: Convert and Open PR stay disabled until it ends, and the previous
        conversion's results and zip go (its folder is replaced by the new job's)."""
        return (gr.update(interactive=False), gr.update(interactive=False), "", "", "",
                gr.update(value=None, visible=False), "Waiting for its turn…", gr.update(value=None, visible=False),
                gr.update(interactive=False), gr.update(interactive=False),
                gr.update(visible=True, interactive=True, value="Cancel"))

    def idle(state: dict | None, recipe_text: str | None, oauth_token: gr.OAuthToken | None):
        state = state or {}
        rows = state.get("latency") or []
        chart = gr.update(value=_latency_frame(rows), visible=True) if rows else gr.update(value=None, visible=False)
        return (*controls(state, recipe_text, oauth_token), gr.update(visible=bool(state.get("zip"))), chart,
                gr.update(interactive=True), gr.update(visible=False), "")

    def remember(model_id: str, revision: str, recipe_text: str):
        return {"model": model_id or "", "revision": revision or "", "recipe": recipe_text or ""}

    def restore(saved: dict | None, state: dict | None, oauth_token: gr.OAuthToken | None):
        """After a reload (signing in reloads the page): the model, revision and the editor's text as they were."""
        saved = {**SAVED, **(saved or {})}
        if not saved["model"]:
            return (gr.update(), gr.update(), gr.update(), gr.update(), gr.update(), gr.update(), gr.update(),
                    state or _new_state())
        status, text, problems_update, targets_update, group, state = load_model(saved["model"], saved["revision"],
                                                                                 state, oauth_token)
        if saved["recipe"].strip() and saved["recipe"].strip() != (text if isinstance(text, str) else "").strip():
            check = logic.check_recipe_text(saved["recipe"], config=state.get("model_config"))
            status = f"{status}\n\nYour edited recipe is back in the editor:\n\n{check.markdown()}"
            text, problems_update, targets_update = saved["recipe"], _problems(check), _target_update(check)
            state = {**state, "recipe_valid": check.valid}
        return saved["model"], saved["revision"], status, text, problems_update, targets_update, group, state

    # ── layout ───────────────────────────────────────────────────────────────

    with gr.Blocks(title="hfexport", delete_cache=(3600, 3600)) as demo:
        state = gr.State(_new_state(), time_to_live=settings.session_ttl_s, delete_callback=release)
        saved = gr.BrowserState(dict(SAVED), storage_key="hfexport-space-v1")
        gr.Markdown(f"# {TITLE}\n\n{INTRO}")
        with gr.Row():
            if sign_in:
                gr.LoginButton()
            user = gr.Markdown(elem_id="user")
        with gr.Row():
            search_box = gr.Textbox(label="Search the Hub's models", placeholder="bert, llama, ... (Enter)", scale=3,
                                    elem_id="search")
            search_note = gr.Markdown(elem_id="search-note")
        found_models = gr.Radio([], label="Models found: pick one", visible=False, elem_id="search-results")
        with gr.Row():
            model_box = gr.Textbox(label="Model repo", placeholder="org/model", scale=3, elem_id="model")
            revision_box = gr.Textbox("", label="Revision (optional)", placeholder="main", scale=1, elem_id="revision")
            load_button = gr.Button("Load recipe", scale=1, elem_id="load")
        load_note = gr.Markdown(elem_id="load-note")
        recipe_status = gr.Markdown(label="Recipe status", elem_id="recipe-status")
        with gr.Group(visible=False) as format_group:
            formats = gr.CheckboxGroup(FORMAT_CHOICES, value=["onnx"], label="Formats for the proposed recipe",
                                       elem_id="formats")
        problems = gr.HighlightedText(label="Recipe check (problem lines highlighted with their JSON path)",
                                      combine_adjacent=True, show_legend=False, elem_id="problems",
                                      elem_classes=["problem-lines"], visible=False)
        editor = gr.Code(label=f"Recipe ({RECIPE_FILE}): edit to try changes; checked as you type", language="json",
                         interactive=True, lines=12, max_lines=20, elem_id="editor")
        variants = gr.CheckboxGroup([], label="Quantized variants: added to the recipe as targets of their own "
                                    "(converted and parity-checked like the others)", elem_id="variants", visible=False)
        with gr.Row():
            sample_image = gr.File(label=logic.SAMPLE_LABELS["image"] + " (PNG, JPEG, WebP...): your own, in place "
                                   "of the recipe's synthesized images", type="filepath", height=110, visible=False,
                                   elem_id="sample-image")
            sample_audio = gr.File(label=logic.SAMPLE_LABELS["audio"] + ", PCM: your own, in place of the recipe's "
                                   "synthesized clips", type="filepath", height=110, visible=False,
                                   elem_id="sample-audio")
        sample_note = gr.Markdown(elem_id="sample-note")
        with gr.Row():
            targets = gr.CheckboxGroup([], label="Targets to convert (none: the recipe's default)", elem_id="targets",
                                       scale=3)
            convert_button = gr.Button("Convert", variant="primary", scale=1, elem_id="convert", interactive=False)
            cancel_button = gr.Button("Cancel", variant="stop", scale=1, elem_id="cancel", visible=False)
            jobs_button = gr.Button("Run on my Hugging Face Jobs", scale=1, elem_id="run-jobs", interactive=False)
            propose_button = gr.Button("Propose recipe", scale=1, elem_id="propose", interactive=False)
        convert_hint = gr.Markdown("Load a model to convert it.", elem_id="convert-hint")
        jobs_hint = gr.Markdown(elem_id="jobs-hint")
        jobs_progress = gr.Markdown(elem_id="jobs-progress")
        propose_result = gr.Markdown(label="Recipe proposal", elem_id="propose-result")
        # The results, outcome first: status, each target passed or failed, the pull request; then what to do with
        # them (the zip, Open PR); then how it went (the step log, the latency) and the full report.
        outcome = gr.Markdown(label="Outcome", elem_id="outcome")
        download = gr.File(label="Artifacts (zip)", interactive=False, height=90, elem_id="download", visible=False)
        with gr.Row():
            pr_button = gr.Button("Open PR", interactive=False, elem_id="open-pr")
            new_repo_button = gr.Button("Publish to my repo", interactive=False, elem_id="publish-new")
        pr_result = gr.Markdown(label="Pull request", elem_id="pr-result")
        progress = gr.Markdown(IDLE, label="Progress", elem_id="progress", min_height=60)
        latency_chart = gr.BarPlot(None, x="run", y="ms", color="batch", sort="y", visible=False,
                                   title="Latency on this Space's CPU (median ms, lower is faster)", y_title="ms",
                                   x_title="", x_label_angle=-30, height=260, elem_id="latency-chart")
        results = gr.Markdown(label="Report", elem_id="results")

        def closed(request: gr.Request):  # the tab was closed: its artifacts go now, not when the state expires
            if request is not None and request.session_hash:
                workspace.release(request.session_hash)

        job_outputs = [progress, outcome, results, download, pr_button, pr_result, latency_chart, propose_result,
                       convert_button, new_repo_button, jobs_progress]
        loaded = [recipe_status, editor, problems, targets, format_group, state]
        gated = [convert_button, convert_hint, pr_button, new_repo_button, jobs_button, jobs_hint, propose_button]
        sample_areas = [sample_image, sample_audio, sample_note]
        demo.load(show_user, None, user, api_visibility="private")
        demo.load(restore, [saved, state], [model_box, revision_box, *loaded], api_visibility="private").then(
            offer_samples, state, sample_areas, api_visibility="private", queue=False).then(
            controls, [state, editor], gated, api_visibility="private", queue=False).then(
            offer_variants, [editor, state], variants, api_visibility="private", queue=False)
        demo.unload(closed)
        search_box.submit(search, search_box, [found_models, search_note], api_name="search_models")
        found_models.input(lambda picked: picked or gr.update(), found_models, model_box, api_visibility="private",
                           queue=False)
        for trigger, api in ((load_button.click, {"api_name": "load_recipe"}),
                             (model_box.submit, {"api_visibility": "private"})):
            trigger(guard_load, model_box, [model_box, load_note], queue=False, api_visibility="private").then(
                forget_results, None, job_outputs, queue=False, api_visibility="private").then(
                load_model, [model_box, revision_box, state], loaded, **api,
            ).then(offer_samples, state, sample_areas, api_visibility="private", queue=False).then(
                controls, [state, editor], gated, api_visibility="private", queue=False).then(
                remember, [model_box, revision_box, editor], saved, api_visibility="private").then(
                offer_variants, [editor, state], variants, api_visibility="private", queue=False)
        formats.input(draft, [model_box, revision_box, formats, state], [recipe_status, editor, problems, targets,
                                                                          state],
                      api_name="draft_recipe").then(controls, [state, editor], gated, api_visibility="private", queue=False).then(
            remember, [model_box, revision_box, editor], saved, api_visibility="private").then(
            offer_variants, [editor, state], variants, api_visibility="private", queue=False)
        editor.input(validate, [editor, state], [recipe_status, problems, targets, state], api_name="validate_recipe",
                     queue=False, trigger_mode="always_last", show_progress="hidden").then(
            controls, [state, editor], gated, api_visibility="private", queue=False).then(
            remember, [model_box, revision_box, editor], saved, api_visibility="private", queue=False).then(
            offer_variants, [editor, state], variants, api_visibility="private", queue=False)
        variants.input(add_variants, [variants, editor, targets, state], [recipe_status, editor, problems, targets,
                                                                          variants, state],
                       api_name="add_quantized_variants", queue=False).then(
            controls, [state, editor], gated, api_visibility="private", queue=False).then(
            remember, [model_box, revision_box, editor], saved, api_visibility="private", queue=False)
        for area, kind in ((sample_image, "image"), (sample_audio, "audio")):
            area.upload(take_sample(kind), [area, state], [area, sample_note, state], api_visibility="private").then(
                controls, [state, editor], gated, api_visibility="private", queue=False)
            area.clear(take_sample(kind), [area, state], [area, sample_note, state], api_visibility="private",
                       queue=False).then(controls, [state, editor], gated, api_visibility="private", queue=False)
        # preprocess=False: a script may name targets without loading the recipe first (the choices of the
        # checkbox group are per session); the job checks the names against the recipe itself.
        convert_button.click(busy, None, [convert_button, pr_button, pr_result, outcome, results, download, progress,
                                          latency_chart, new_repo_button, load_button, cancel_button],
                             queue=False, api_visibility="private").then(
            convert, [model_box, revision_box, editor, targets, state],
            [progress, outcome, results, download, pr_button, state],
            api_name="convert", concurrency_limit=1, concurrency_id="export", show_progress_on=[progress],
            preprocess=False,
        ).then(idle, [state, editor], [*gated, download, latency_chart, load_button, cancel_button, load_note],
               api_visibility="private", queue=False)
        cancel_button.click(cancel_conversion, None, cancel_button, queue=False, api_name="cancel")
        pr_button.click(open_pr, state, [pr_result, state], api_name="open_pr", concurrency_limit=2,
                        concurrency_id="publish").then(
            _outcome, state, outcome, api_visibility="private", queue=False).then(
            controls, [state, editor], gated, api_visibility="private", queue=False)
        new_repo_button.click(publish_new, state, pr_result, api_name="publish_to_my_repo", concurrency_limit=2,
                              concurrency_id="publish")
        jobs_button.click(lambda: (gr.update(interactive=False), ""), None, [jobs_button, jobs_progress], queue=False,
                          api_visibility="private").then(
            run_jobs, [model_box, revision_box, editor, targets, state], [jobs_progress, state],
            api_name="run_on_my_jobs", concurrency_limit=4, concurrency_id="jobs", preprocess=False,
        ).then(controls, [state, editor], gated, api_visibility="private", queue=False)
        propose_button.click(propose, [model_box, editor, state], propose_result, api_name="propose_recipe",
                             concurrency_limit=2, concurrency_id="publish")
    demo.hfexport_settings = settings  # type: ignore[attr-defined]
    demo.hfexport_runner = runner  # type: ignore[attr-defined]
    return demo


def _outcome(state: dict) -> str:
    """The outcome of the session's last conversion (`logic.outcome_markdown`), with its pull request once open."""
    report = state.get("report")
    if report is None:
        return ""
    return logic.outcome_markdown(report, pr_url=state.get("pr_url"), pr_num=state.get("pr"),
                                  failure=state.get("failure"), model=state.get("model"))


def _session(request: gr.Request | None) -> str | None:
    return request.session_hash if request is not None and request.session_hash else None


def _latency_frame(rows: list[dict]):
    import pandas as pd  # a Gradio dependency

    return pd.DataFrame(rows, columns=["run", "ms", "batch"])


def _problems(check: logic.RecipeCheck):
    """The recipe with its problem lines highlighted, shown only while there are problems."""
    return gr.update(value=check.highlighted(context=4) if not check.valid else [], visible=not check.valid)


def _target_update(check: logic.RecipeCheck):
    """The recipe's targets to tick, its default ticked; none while it does not validate (never an earlier
    recipe's)."""
    names = check.targets
    if not check.valid:
        return gr.update(choices=[], value=[])
    return gr.update(choices=names, value=[check.recipe.default_target] if names else [])


def launch(settings: logic.SpaceSettings | None = None, sign_in: bool | None = None, **launch_kwargs) -> gr.Blocks:
    """Build, queue (one export at a time, a bounded queue) and launch; returns the running Blocks.

    `sign_in=None`: with a sign-in button unless this is a local run whose mocked sign-in cannot work (no login
    on the machine, or one the Hub endpoint refuses): then one line says why and what to set, and the Space runs
    signed out instead of ending in Gradio's traceback."""
    if sign_in is None:
        problem = logic.local_sign_in_problem()
        if problem:
            print(f"hfexport Space: {problem}", file=sys.stderr, flush=True)
        sign_in = problem is None
    demo = build_app(settings, sign_in=sign_in)
    settings = demo.hfexport_settings  # type: ignore[attr-defined]
    demo.hfexport_runner.start()  # type: ignore[attr-defined] # the job process imports the engine meanwhile
    logic.warm_up_live_check()  # and this one what the live check's dry plan needs (torch, transformers)
    demo.queue(max_size=settings.queue_size, default_concurrency_limit=8)
    allowed = [str(Path(settings.workdir).resolve()), *launch_kwargs.pop("allowed_paths", [])]
    demo.launch(allowed_paths=allowed, css=CSS, footer_links=["api"], **launch_kwargs)
    return demo


if __name__ == "__main__":
    launch()  # host and port: GRADIO_SERVER_NAME / GRADIO_SERVER_PORT (a Space sets them), else 127.0.0.1:7860
