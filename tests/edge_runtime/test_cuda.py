"""The CUDA driver runtime: clear errors without a driver; on a GPU, the zoo against the reference.

The GPU tests skip cleanly where no NVIDIA GPU and driver exist (the build machines); where one
does, every zoo model runs from PTX built for Orin (sm_87) and for Xavier (sm_72), which the
driver JIT-compiles for the GPU at hand.
"""

from __future__ import annotations

import contextlib
import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from cuvil.compiler import run_reference
from cuvil.edge_runtime import cuda
from cuvil.edge_runtime.cuda import CudaError, CudaModel, CudaUnavailable, gpu_available, gpu_target_for

RTOL, ATOL = 1e-4, 1e-5
HAVE_GPU = gpu_available()
needs_gpu = pytest.mark.skipif(not HAVE_GPU, reason="no NVIDIA GPU / libcuda on this machine")


def test_missing_driver_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(cuda, "LIBCUDA_NAMES", ("libcuda-not-here.so.0",))
    with pytest.raises(CudaUnavailable, match="libcuda"):
        cuda.Driver()
    assert gpu_available() is False


def test_gpu_targets_from_profiles():
    assert gpu_target_for("jetson-orin").cpu == "sm_87"
    assert gpu_target_for("jetson-xavier").cpu == "sm_72"
    assert gpu_target_for(None).cpu == "sm_87"
    thor = gpu_target_for("jetson-thor")
    assert thor.cpu == "sm_110" and "+ptx90" in thor.features
    from cuvil.devices import resolve_target

    assert "+ptx90" in gpu_target_for(resolve_target("jetson-thor")).features  # from a CPU Target too
    with pytest.raises(CudaError, match="no GPU"):
        gpu_target_for("rpi5")


# --- the driver-API path end to end on a fake libcuda (no GPU needed) --------------------------------
@pytest.fixture(scope="module")
def fake_libcuda(tmp_path_factory):
    if not shutil.which("gcc"):
        pytest.skip("needs gcc to build the fake libcuda")
    out = tmp_path_factory.mktemp("fakecuda") / "libcuda_fake.so"
    src = Path(__file__).with_name("fake_libcuda.c")
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(out), str(src)], check=True)
    return out


@contextlib.contextmanager
def _simulated_launches(lib, model: CudaModel):
    """Within it, the fake driver's cuLaunchKernel runs ``model``'s kernels on the simulated GPU (the
    callback lives as long; the simulator is freed on leaving, not by a later garbage collection)."""
    from tests.compiler.codegen.gpu_sim import SimulatedGpu

    sim = SimulatedGpu(model.program)
    nargs = {la.kernel: len(la.args) for la in model.program.launches}

    @ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_uint, ctypes.c_uint, ctypes.POINTER(ctypes.c_void_p))
    def on_launch(name, grid, block, params):
        kernel = name.decode()
        sim.launch(kernel, [ctypes.c_uint64.from_address(params[i]).value for i in range(nargs[kernel])])

    lib.fake_set_callback(on_launch)
    yield


def test_driver_path_on_a_fake_libcuda(fake_libcuda, monkeypatch):
    """Every driver call CudaModel makes, with real argument marshalling: the fake driver's
    cuLaunchKernel passes the kernel's void** parameters to the host-compiled kernels."""
    from tests.devices.test_isa import _graph

    monkeypatch.setattr(cuda, "LIBCUDA_NAMES", (str(fake_libcuda),))
    lib = ctypes.CDLL(str(fake_libcuda))
    graph = _graph()
    model = CudaModel(graph, "jetson-xavier")
    with _simulated_launches(lib, model):
        assert gpu_available() and "Fake GPU" in model.device_name and "sm_87" in model.device_name
        uploaded = lib.fake_htod_bytes()
        assert uploaded == len(model.program.weights)
        rng = np.random.default_rng(0)
        for run in range(2):
            feeds = {"x": rng.standard_normal((3, 67)).astype(np.float32)}
            got, want = model.run(feeds), run_reference(graph, feeds)
            np.testing.assert_allclose(got[graph.outputs[0]], want[graph.outputs[0]], rtol=RTOL, atol=ATOL)
            assert lib.fake_launches() == (run + 1) * len(model.program.launches)
        assert lib.fake_htod_bytes() - uploaded == 2 * 3 * 67 * 4  # weights went up once; inputs per run
        with pytest.raises(Exception, match="missing input"):
            model.run({})
        assert len(model.latency_ms(iterations=3, warmup=1)) == 3
        model.close()
        assert lib.fake_live_allocations() == 0


def test_an_index_outside_its_axis_is_refused_on_a_fake_libcuda(fake_libcuda, monkeypatch):
    """The fault word the Gather kernel sets is read back after the run (and cleared)."""
    from cuvil.compiler import DType, TensorType
    from cuvil.compiler.errors import RunTimeCheckError
    from cuvil.compiler.frontends.builder import GraphBuilder

    monkeypatch.setattr(cuda, "LIBCUDA_NAMES", (str(fake_libcuda),))
    lib = ctypes.CDLL(str(fake_libcuda))
    gb = GraphBuilder("g")
    data, idx = gb.input("data", TensorType(DType.F32, (2, 3))), gb.input("idx", TensorType(DType.I64, (2,)))
    model = CudaModel(gb.build([gb.add1("Gather", [data, idx], axis=1)]), "jetson-orin")
    with _simulated_launches(lib, model):
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        with pytest.raises(RunTimeCheckError):
            model.run({"data": x, "idx": np.array([0, 3])})
        (got,) = model.run({"data": x, "idx": np.array([-1, 0])}).values()
        np.testing.assert_array_equal(got, np.array([[2, 0], [5, 3]], np.float32))
        model.close()


def test_bool_inputs_of_any_nonzero_byte_are_true_on_a_fake_libcuda(fake_libcuda, monkeypatch):
    """As on the host (``test_session``): a mask byte of 2 or 255 that NumPy takes for True goes up as 1."""
    from cuvil.compiler import DType, Node, TensorType, infer_graph_types

    monkeypatch.setattr(cuda, "LIBCUDA_NAMES", (str(fake_libcuda),))
    lib = ctypes.CDLL(str(fake_libcuda))
    graph = infer_graph_types("g", {"m": TensorType(DType.BOOL, (4,))}, {},
                              [Node.make("Cast", ["m"], ["f"], to=DType.F32)], ["f"])
    model = CudaModel(graph, "jetson-orin")
    with _simulated_launches(lib, model):
        (got,) = model.run({"m": np.array([2, 1, 0, 255], np.uint8).view(np.bool_)}).values()
        assert got.tolist() == [1.0, 1.0, 0.0, 1.0]
        model.close()


@pytest.mark.gpu
@needs_gpu
@pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")
@pytest.mark.parametrize("profile", ["jetson-orin", "jetson-xavier"])
@pytest.mark.parametrize("name", ["mlp", "small_cnn", "resnet18", "mobilenet_v2", "tiny_transformer"])
def test_zoo_on_the_gpu(name, profile):
    torch = pytest.importorskip("torch")
    from cuvil.compiler.frontends.torch import import_torch
    from tests.zoo import ZOO

    model, example = ZOO[name]()
    with torch.no_grad():
        graph = import_torch(model, example)
    rng = np.random.default_rng(0)
    with CudaModel(graph, profile) as gpu:
        for _ in range(2):  # the second run reuses the uploaded weights and the arena
            feeds = {n: rng.standard_normal(tuple(x.shape)).astype(np.float32) for n, x in zip(graph.inputs, example)}
            got, want = gpu.run(feeds), run_reference(graph, feeds)
            for out in graph.outputs:
                np.testing.assert_allclose(got[out], want[out], rtol=RTOL, atol=ATOL, err_msg=f"{name} {profile}")
