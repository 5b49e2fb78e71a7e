"""FinMCP-Bench (financial MCP tool use): loader, replayed tool responses, TF1 / exact-match scoring."""

from envace.envs.finmcp.adapter import FinMCPAdapter, finmcp_report, sample_of
from envace.envs.finmcp.data import FinMCPFormatError, FinMCPSample, RecordedCall, load_samples
from envace.envs.finmcp.replay import ReplayConfig, ReplayExecutor, ReplayResponder, UnrecordedMode, call_key
from envace.envs.finmcp.scoring import ToolCallScore, ToolMetrics, aggregate, grouped_metrics, score_tool_names
from envace.envs.finmcp.tools import infer_tool_schemas, load_tool_schemas

__all__ = [
    "FinMCPAdapter",
    "FinMCPFormatError",
    "FinMCPSample",
    "RecordedCall",
    "ReplayConfig",
    "ReplayExecutor",
    "ReplayResponder",
    "ToolCallScore",
    "ToolMetrics",
    "UnrecordedMode",
    "aggregate",
    "call_key",
    "finmcp_report",
    "grouped_metrics",
    "infer_tool_schemas",
    "load_samples",
    "load_tool_schemas",
    "sample_of",
    "score_tool_names",
]
