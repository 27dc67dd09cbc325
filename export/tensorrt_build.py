"""ONNX -> TensorRT engine through the TensorRT Python API (ONNX parser, optimization profile,
timing cache, serialized engine).

Written from the TensorRT 10 documentation; TensorRT cannot be installed on our machines,
so :func:`build_engine` has only run against a stand-in module in the tests. Precision is
carried by the ONNX graph itself (an fp16 graph for fp16) and the network is built
*strongly typed*: TensorRT deprecated the FP16/BF16 builder flags in 10.12 and removed
them in 11, where strong typing is the only mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dmae_fast.base.errors import UserError
from dmae_fast.engines.sidecar import BatchRange
from dmae_fast.engines.tensorrt_engine import import_tensorrt
from dmae_fast.export.onnx_export import operators

# Operators the TensorRT 10.x ONNX parser supports (onnx-tensorrt docs/operators.md,
# "Operator Support Matrix", rows marked Y; TensorRT 10.15, opsets 9-24).
TENSORRT_ONNX_OPS = frozenset("""
Abs Acos Acosh Add And ArgMax ArgMin Asin Asinh Atan Atanh Attention AveragePool BatchNormalization
BlackmanWindow Cast CastLike Ceil Celu Clip Concat Constant ConstantOfShape Conv ConvTranspose Cos Cosh
CumSum DeformConv DepthToSpace DequantizeLinear Div Dropout Einsum Elu Equal Erf Exp Expand EyeLike
Flatten Floor Gather GatherElements GatherND Gelu Gemm GlobalAveragePool GlobalLpPool GlobalMaxPool
Greater GreaterOrEqual GridSample GroupNormalization GRU HammingWindow HannWindow HardSigmoid HardSwish
Hardmax Identity If ImageScaler InstanceNormalization IsInf IsNaN LayerNormalization LeakyRelu Less
LessOrEqual Log LogSoftmax Loop LRN LSTM LpNormalization LpPool MatMul Max MaxPool Mean
MeanVarianceNormalization Min Mish Mod Mul Neg NonMaxSuppression NonZero Not OneHot Or Pad
ParametricSoftplus Pow PRelu QuantizeLinear RandomNormal RandomNormalLike RandomUniform
RandomUniformLike Range Reciprocal ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean
ReduceMin ReduceProd ReduceSum ReduceSumSquare Relu Reshape Resize ReverseSequence RMSNormalization RNN
RoiAlign RotaryEmbedding Round STFT ScaledTanh Scan Scatter ScatterElements ScatterND Selu Shape Shrink
Sigmoid Sign Sin Sinh Size Slice Softmax Softplus Softsign SpaceToDepth Split Sqrt Squeeze Sub Sum Tan
Tanh TensorScatter ThresholdedRelu Tile TopK Transpose Trilu Unsqueeze Upsample Where Xor
""".split())
WORKSPACE_BYTES = 4 << 30  # builder scratch memory limit; TensorRT uses less at run time if it can


def check_tensorrt_operators(onnx_path: Path) -> None:
    """One-line error if the graph uses an operator TensorRT's ONNX parser does not support."""
    unsupported = sorted(operators(onnx_path) - TENSORRT_ONNX_OPS)
    if unsupported:
        raise UserError(f"{onnx_path.name} uses ONNX operators TensorRT does not parse: {', '.join(unsupported)}")


def profile_shapes(input_shape: tuple[int, ...], batch: BatchRange) -> tuple[tuple[int, ...], ...]:
    """(min, opt, max) input shapes of the optimization profile: only the batch axis varies."""
    return tuple((size, *input_shape) for size in (batch.min, batch.opt, batch.max))


@dataclass(frozen=True)
class TensorRTBuild:
    """One engine build: the ONNX graph in, the serialized engine out."""

    onnx: Path
    engine: Path
    input_name: str
    input_shape: tuple[int, ...]
    batch: BatchRange
    precision: str  # informational: the ONNX graph's own types decide (strong typing)
    timing_cache: Path
    workspace_bytes: int = WORKSPACE_BYTES


def build_engine(build: TensorRTBuild) -> str:
    """Build and serialize the engine; reuses and updates the timing cache. Returns TensorRT's version."""
    trt = import_tensorrt()
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(build.onnx)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise UserError(f"TensorRT's ONNX parser rejected {build.onnx.name}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, build.workspace_bytes)
    if build.precision == "fp32":
        config.clear_flag(trt.BuilderFlag.TF32)  # fp32 means fp32 matrix products too
    profile = builder.create_optimization_profile()
    low, opt, high = profile_shapes(build.input_shape, build.batch)
    profile.set_shape(build.input_name, low, opt, high)
    config.add_optimization_profile(profile)
    cached = build.timing_cache.read_bytes() if build.timing_cache.is_file() else b""
    config.set_timing_cache(config.create_timing_cache(cached), False)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise UserError(f"TensorRT could not build an engine from {build.onnx.name} (see TensorRT's messages above)")
    build.engine.write_bytes(bytes(serialized))
    build.timing_cache.write_bytes(bytes(config.get_timing_cache().serialize()))
    return trt.__version__
