"""The `cuvil` command: a thin layer over :mod:`cuvil.api`.

Errors are formatted in one place (:class:`_Cli`): a CuvilError or OSError prints one line
``error: ...`` on stderr and exits 1; usage errors exit 2; Ctrl-C exits 130; ``--debug`` shows the traceback
instead.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

import click
from click.core import ParameterSource

from . import api, native
from .version import __version__
from .compiler.calibration import METHODS as CALIBRATION_METHODS
from .compiler.quantize import DEFAULT_BIAS_CORRECTION, DEFAULT_METHOD
from .compiler.errors import CuvilError
from .compiler.printable import printable
from .compiler.codegen.cpu.threads import MAX_THREADS

_FILE = click.Path(dir_okay=False, path_type=Path)
_EXISTING = click.Path(dir_okay=False, path_type=Path)  # a missing file is an OSError: one line, exit 1
_THREADS = click.IntRange(1, MAX_THREADS)


def _one_line(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        text = f"{e.strerror}: {e.filename}" if e.filename else e.strerror
    else:
        text = str(e) or type(e).__name__
    return printable(" ".join(text.split()))


INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, what a shell reports (and :mod:`.__main__` leaves stuck threads behind)


class _Cli(click.Group):
    def main(self, *args, **kwargs):
        """Closed stdout is an error (every command exited 0 having printed nothing), and so is one that
        fails while ``--help`` or ``--version`` prints, before a command runs (a 33-line traceback)."""
        if sys.stdout is None:
            click.echo("error: standard output is closed", err=True)
            sys.exit(1)
        try:
            return super().main(*args, **kwargs)
        except OSError as e:
            click.echo(f"error: {_one_line(e)}", err=True)
            sys.exit(1)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (CuvilError, OSError) as e:
            if ctx.params.get("debug"):
                raise
            click.echo(f"error: {_one_line(e)}", err=True)
            ctx.exit(1)
        except KeyboardInterrupt:  # not click's "Aborted!" and exit 1
            if ctx.params.get("debug"):
                raise
            click.echo("error: interrupted", err=True)
            ctx.exit(INTERRUPTED)


@click.group(cls=_Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show the full traceback on errors.")
@click.version_option(__version__, prog_name="cuvil")
def main(debug: bool) -> None:
    """Cuvil: signed model bundles for edge fleets."""


@main.command()
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory for NAME.key (private, mode 0600) and NAME.pub.")
@click.option("--name", default="cuvil", show_default=True, help="Base name of the key files.")
@click.option("--force", is_flag=True, help="Replace existing key files.")
def keygen(out_dir: Path, name: str, force: bool) -> None:
    """Create an Ed25519 signing key pair."""
    pair = api.keygen(out_dir, name, force)
    click.echo(printable(f"private key: {pair.private_path}  (keep it secret)"))
    click.echo(printable(f"public key:  {pair.public_path}"))
    click.echo(f"fingerprint: {pair.fingerprint}")


@main.command("import")
@click.argument("model", type=_EXISTING)
@click.option("-o", "--output", required=True, type=_FILE, help="Bundle to write (.cuvil).")
@click.option("--key", required=True, type=_EXISTING, help="Private key (PEM) to sign with.")
@click.option("--name", default=None, help="Model name (default: the graph's name).")
@click.option("--model-version", default="0", show_default=True, help="Model version string.")
@click.option("--int8", is_flag=True, help="Quantize to int8 (a QDQ model is taken as it is quantized).")
@click.option("--calibration", type=_EXISTING, default=None,
              help="Calibration inputs .npz keyed by input name, samples along axis 0 (with --int8).")
@click.option("--calibration-method", type=click.Choice(CALIBRATION_METHODS), default=DEFAULT_METHOD,
              show_default=True, help="How activation ranges are chosen (docs/quantization.md).")
@click.option("--percentile", type=float, default=99.99, show_default=True, help="For --calibration-method percentile.")
@click.option("--bias-correction/--no-bias-correction", default=DEFAULT_BIAS_CORRECTION, show_default=True,
              help="Take the mean error of the int8 weights out of each bias (with --calibration).")
@click.option("--reduce-range", is_flag=True,
              help="7-bit weights (|w| <= 63): faster on AVX2 CPUs without VNNI, a little less accurate (with --calibration).")
@click.option("--float-layer", "float_layers", multiple=True, metavar="NAME",
              help="Keep this layer (a name in the report) in float; repeatable (with --calibration).")
@click.option("--sensitivity", is_flag=True,
              help="Report what each layer costs the output alone (one more calibration pass a layer).")
@click.option("--target-agreement", type=float, default=None, metavar="FRACTION",
              help="Keep the fewest leading layers in float that give this top-1 agreement with the float "
                   "model, e.g. 0.99 (with --calibration).")
@click.option("--check-inputs", type=_EXISTING, default=None,
              help="Held-out inputs .npz (like --calibration) that --target-agreement is measured on "
                   "(default: the calibration inputs).")
def import_(model: Path, output: Path, key: Path, name: str | None, model_version: str, int8: bool,
            calibration: Path | None, calibration_method: str, percentile: float, bias_correction: bool,
            reduce_range: bool, float_layers: tuple[str, ...], sensitivity: bool, target_agreement: float | None,
            check_inputs: Path | None) -> None:
    """Import an ONNX model and write it as a signed bundle."""
    given = click.get_current_context().get_parameter_source("percentile") is not ParameterSource.DEFAULT
    if given and calibration_method != "percentile":
        raise click.UsageError("--percentile is for --calibration-method percentile")
    graph = api.import_model(model)
    if calibration is not None and not int8:
        raise CuvilError("--calibration is for --int8")
    for flag, given in (("--reduce-range", reduce_range), ("--float-layer", float_layers),
                        ("--sensitivity", sensitivity), ("--target-agreement", target_agreement is not None),
                        ("--check-inputs", check_inputs)):
        if given and calibration is None:
            raise CuvilError(f"{flag} is for --int8 --calibration (a QDQ model keeps its own quantization)")
    if int8:
        checks = api.read_inputs(graph, npz=check_inputs) if check_inputs is not None else None
        graph = _int8(graph, calibration, dict(method=calibration_method, percentile=percentile,
                                               bias_correction=bias_correction, reduce_range=reduce_range,
                                               float_layers=float_layers, sensitivity=sensitivity,
                                               target_agreement=target_agreement, check_inputs=checks))
    done = api.export(graph, output, key, name=name, version=model_version)
    click.echo(printable(f"wrote {done.path} ({done.size} bytes, {done.weight_bytes} weight bytes)"))
    click.echo(f"signed by {done.signer}, content {done.content_hash}")


def _int8(graph, calibration: Path | None, options: dict):
    """The graph quantized from the calibration inputs (printing the per-layer report), or a QDQ
    graph as it is quantized; either in integer form (what devices compile; each scale once)."""
    quantized = any(n.op in ("QuantizeLinear", "QConv", "QMatMul") for n in graph.nodes)
    if calibration is None:
        if quantized:
            click.echo("the model is quantized already (QDQ): imported as it is")
            return api.integer_form(graph)
        raise CuvilError("--int8 needs --calibration <inputs.npz> for a float model")
    if quantized:
        raise CuvilError("the model is quantized already: leave out --calibration")
    done = api.quantize(graph, api.read_inputs(graph, npz=calibration), **options)
    click.echo(done.report.format())
    return api.integer_form(done.graph)


def _sve_bits(_ctx, _param, bits: int | None) -> int | None:
    if bits is None:
        return None
    from .devices.profile import check_sve_bits

    try:
        return check_sve_bits(bits)
    except ValueError as e:
        raise click.BadParameter(f"{bits}: {e}") from None


def _count(n: float, unit: str) -> str:
    for prefix in ("", "K", "M", "G", "T"):
        if abs(n) < 1000 or prefix == "T":
            return f"{n:.0f} {unit}" if prefix == "" else f"{n:.2f} {prefix}{unit}"
        n /= 1000
    return f"{n} {unit}"


@main.command()
@click.argument("path", type=_EXISTING)
@click.option("--trust", "trust", multiple=True, type=_EXISTING, help="Trusted public key (repeatable).")
@click.option("--graph/--no-graph", default=True, help="Print the text IR.")
def inspect(path: Path, trust: tuple[Path, ...], graph: bool) -> None:
    """Show a bundle's or an ONNX model's IR and summary."""
    info = api.inspect_model(path, trust or None)
    if graph:
        click.echo("".join(printable(line) + "\n" for line in info.graph_text.splitlines()), nl=False)
    s = info.summary
    unparsed = "not computed: the signer is not trusted here, so the graph was not parsed (pass --trust KEY)"
    if info.bundle is not None:
        b, m = info.bundle, info.bundle.manifest
        click.echo(printable(f"model:       {m.name} {m.version}  (producer {m.producer})"))
        click.echo(f"signer:      {b.signer} ({'trusted' if b.trusted else 'NOT trusted here'})")
        click.echo(f"content:     {b.content_hash}")
        click.echo(f"bundle:      {b.size} bytes")
        if m.lineage is not None:
            lin = m.lineage
            click.echo(printable(f"lineage:     fine-tuned from {lin.parent_version} ({lin.parent[:12]}) in "
                                 f"{lin.rounds} round(s) on {lin.devices} device(s), ε ≤ {lin.epsilon} "
                                 f"(δ = {lin.delta}) per device, {lin.method}"))
    click.echo(f"parameters:  {s.parameters}")
    click.echo(f"FLOPs:       {unparsed if s.flops is None else _count(s.flops, 'FLOPs') + ' (batch 1)'}")
    click.echo(f"weights:     {s.weight_bytes} bytes")
    for what, values in (("inputs", s.inputs), ("outputs", s.outputs)):
        click.echo(f"{what + ':':<12} " + printable(", ".join(f"{n}: {t}" for n, t in values)))
    if s.op_counts is None:
        click.echo(f"{'nodes:':<12} {unparsed}")
    else:
        click.echo(f"{'nodes:':<12} {s.node_count} (" + ", ".join(f"{op} {n}" for op, n in s.op_counts) + ")")


@main.command()
@click.argument("parent", type=_EXISTING)
@click.argument("target", type=_EXISTING)
@click.option("-o", "--output", required=True, type=_FILE, help="Delta to write.")
@click.option("--key", required=True, type=_EXISTING, help="Private key (PEM) to sign with; devices must trust it.")
def delta(parent: Path, target: Path, output: Path, key: Path) -> None:
    """Write a signed delta that makes bundle TARGET from bundle PARENT (what a device holding PARENT is sent)."""
    d = api.make_delta(parent, target, key, output)
    click.echo(printable(f"delta {d.parent[:12]} -> {d.target[:12]}: {output}, {d.size} bytes "
                         f"({d.size / d.target_size:.2f}x the {d.target_size}-byte bundle)"))


@main.command()
@click.argument("path", type=_EXISTING)
@click.option("--trust", "trust", multiple=True, type=_EXISTING,
              help="Trusted public key (repeatable; default: the trust directory).")
def verify(path: Path, trust: tuple[Path, ...]) -> None:
    """Check a bundle's signature, layout and weight hashes."""
    model = api.load(path, trust or None)
    click.echo(printable(f"ok: {path} is {model.name} {model.version}, signed by trusted key {model.signer}"))
    click.echo(f"content {model.content_hash}")


@main.command()
@click.argument("path", type=_EXISTING)
@click.option("--trust", "trust", multiple=True, type=_EXISTING,
              help="Trusted public key (repeatable; default: the trust directory).")
@click.option("--input", "npy", type=_EXISTING, help="Input .npy for a single-input model.")
@click.option("--inputs", "npz", type=_EXISTING, help="Inputs .npz keyed by input name.")
@click.option("--output", type=_FILE, help="Write outputs to this .npz.")
@click.option("--reference", is_flag=True, help="Use the NumPy reference interpreter instead of native code.")
@click.option("--device", default=None, help="Run as this device class would (a profile name, or host); "
              "foreign CPUs are emulated with qemu-user, and the output says so.")
@click.option("--sve-bits", type=int, default=None, callback=_sve_bits,
              help="SVE vector length for an emulated SVE device (a multiple of 128 from 128 to 2048).")
@click.option("--threads", type=_THREADS, default=None,
              help="Threads one inference runs on (default: this machine's cores, capped by its tuning).")
def run(path: Path, trust: tuple[Path, ...], npy: Path | None, npz: Path | None, output: Path | None,
        reference: bool, device: str | None, sve_bits: int | None, threads: int | None) -> None:
    """Verify a bundle and run it on inputs: native code for this machine by default."""
    if (npy is None) == (npz is None):
        raise click.UsageError("give exactly one of --input X.npy or --inputs IN.npz")
    if reference and device:
        raise click.UsageError("--reference and --device exclude each other")
    if sve_bits is not None and device is None:
        raise click.UsageError("--sve-bits is for --device (an emulated SVE device)")
    model = api.load(path, trust or None, lazy=True)  # a cache hit never reads the weights
    inputs = api.read_inputs(model, npy, npz)
    if reference:
        outputs = api.run_reference(model, inputs)
    elif device is None:
        outputs = native.run_native(model, inputs, threads=threads)
    else:
        from .preflight import run_as_device

        done = run_as_device(model.graph, inputs, device, sve_vector_bits=sve_bits, content_hash=model.content_hash)
        click.echo(done.note)
        outputs = done.outputs
    if output is not None:
        api.save_outputs(output, outputs)
        click.echo(printable(f"wrote {output} ({', '.join(outputs)})"))
    else:
        for name, arr in outputs.items():
            click.echo(printable(f"{name}: {arr.dtype}{list(arr.shape)}"))


@main.command("compile")
@click.argument("path", type=_EXISTING)
@click.option("--trust", "trust", multiple=True, type=_EXISTING,
              help="Trusted public key (repeatable; default: the trust directory).")
@click.option("--target", required=True, help="Device profile name (or host): compile exactly as that device would.")
@click.option("--batch", type=click.IntRange(1), default=1, show_default=True)
@click.option("--output", "-o", type=_FILE, default=None, help="Write the object file here.")
@click.option("--gpu", is_flag=True, help="Also emit the PTX of the profile's GPU (Jetson).")
@click.option("--tune/--no-tune", default=None,
              help="Time each conv layer's candidate kernels on this CPU and keep the fastest (default: the "
                   "profile's [tuning]; only where the target's code runs here).")
def compile_(path: Path, trust: tuple[Path, ...], target: str, batch: int, output: Path | None, gpu: bool,
             tune: bool | None) -> None:
    """Compile a bundle for a device class and report the vector ISA its code really uses."""
    from .preflight import compile_for

    model = api.load(path, trust or None)
    r = compile_for(model.graph, target, batch, output, gpu, tune)
    click.echo(f"target:      {r.target} ({r.triple}, cpu {r.cpu})")
    click.echo(f"code:        {r.object_bytes} bytes, {r.kernels} kernels for {r.nodes} nodes "
               f"(lower {r.lower_ms:.0f} ms, LLVM {r.llvm_ms:.0f} ms)")
    click.echo(f"memory:      arena {r.arena_bytes} bytes (activations: {r.plan_summary}), "
               f"weights {r.weight_bytes} bytes")
    click.echo(f"{r.isa.summary()} [{r.isa_source}]")
    if r.tuning is not None:
        click.echo(f"tuning:      {len(r.tuning.choices)} of {len(r.tuning.results)} conv layers changed by "
                   f"measurement in {r.tuning.spent_s * 1e3:.0f} ms ({r.tuning.skipped} left to the cost model); "
                   f"{len(r.tuning.parts)} thread splits changed")
    if r.object_path:
        click.echo(printable(f"wrote {r.object_path}"))
    if r.ptx_path:
        click.echo(printable(f"wrote {r.ptx_path} ({r.ptx_kernels} GPU kernels)"))


@main.command()
@click.argument("path", type=_EXISTING)
@click.option("--trust", "trust", multiple=True, type=_EXISTING,
              help="Trusted public key (repeatable; default: the trust directory).")
@click.option("--runs", type=int, default=200, show_default=True, help="Timed runs after warm-up.")
@click.option("--warmup", type=int, default=20, show_default=True)
@click.option("--batch", type=int, default=1, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.option("--threads", type=_THREADS, default=None,
              help="Threads one inference runs on (default: this machine's cores, capped by its tuning).")
def bench(path: Path, trust: tuple[Path, ...], runs: int, warmup: int, batch: int, as_json: bool,
          threads: int | None) -> None:
    """Compile a bundle natively and measure cold compile, warm start and latency percentiles."""
    if runs < 5 or warmup < 0 or batch < 1:
        raise click.UsageError("--runs must be >= 5, --warmup >= 0 and --batch >= 1")
    r = native.bench(api.load(path, trust or None), runs=runs, warmup=warmup, batch=batch, threads=threads)
    if as_json:
        click.echo(json.dumps(r.as_dict(), indent=2))
        return
    lat = r.latency
    click.echo(f"latency:      p50 {lat.p50_ms:.4f} ms  p90 {lat.p90_ms:.4f} ms  p99 {lat.p99_ms:.4f} ms "
               f"({lat.runs} runs after {lat.warmup} warm-up, batch {batch}, {r.threads} thread(s), synthetic inputs)")
    click.echo(f"cold compile: {r.cold_compile_s:.2f} s ({r.kernels} kernels)")
    click.echo(f"warm start:   {r.warm_start_ms:.1f} ms (compile cache hit to first result)")
    click.echo(f"arena:        {r.arena_bytes} bytes (lower bound {r.lower_bound_bytes})")


@main.command()
def devices() -> None:
    """List the device profiles (and this machine's own) that Cuvil compiles for."""
    rows = [(p.name, p.triple, p.cpu, "scalable (SVE)" if p.vector_bits is None else f"{p.vector_bits}-bit",
             p.gpu_arch or "-", str(p.default_threads), p.description) for p in native.device_profiles()]
    head = ("profile", "triple", "cpu", "vectors", "gpu", "threads")
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    click.echo("  ".join(h.ljust(w) for h, w in zip(head, widths)) + "  description")
    for r in rows:
        click.echo(printable("  ".join(c.ljust(w) for c, w in zip(r[:-1], widths)) + "  " + r[-1]))


from .cli_fleet import register as _register_fleet  # noqa: E402  (fleet commands: demo, device-provision)
from .cli_results import register as _register_results  # noqa: E402  (results, report, dashboard)

_register_fleet(main)
_register_results(main)

_OUTPUTS = ("output", "out_path")  # the parameters a command writes a file to


def _refuse_inputs_as_outputs(params: dict) -> None:
    """CuvilError where an output path is one of the command's own input files: ``import -o KEY --key
    KEY`` replaced the signing key with a bundle, ``report -o DB --db DB`` the results database."""
    inputs = [v for k, value in params.items() if k not in _OUTPUTS
              for v in (value if isinstance(value, tuple) else (value,)) if isinstance(v, Path)]
    for name in _OUTPUTS:
        out = params.get(name)
        for path in inputs if isinstance(out, Path) and out.exists() else ():
            if path.exists() and os.path.samefile(out, path):
                raise CuvilError(f"the output {out} is the input {path}: refusing to overwrite it")


def _guard(cmd: click.Command) -> None:
    """Every command, nested ones included, checks its outputs against its inputs before it runs."""
    for sub in getattr(cmd, "commands", {}).values():
        _guard(sub)
    run = cmd.callback
    if run is None or isinstance(cmd, click.Group):
        return

    @functools.wraps(run)
    def guarded(**params):
        _refuse_inputs_as_outputs(params)
        return run(**params)

    cmd.callback = guarded


_guard(main)

if __name__ == "__main__":  # pragma: no cover
    main()
