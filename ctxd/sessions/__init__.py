"""Sessions: the Supervisor, one SessionActor per session, its operations by feature,
budgets, render; the route table (ctxd/daemon/_routes.py) runs the operations."""

from ctxd.sessions._actor import SessionActor
from ctxd.sessions._branch_ops import create_branch, list_branches, return_branch, rollback
from ctxd.sessions._files import read_inside
from ctxd.sessions._fork import context_fork
from ctxd.sessions._hygiene_ops import (
    Search,
    compact,
    offered_tools,
    read_result,
    register_tools,
    search_tools,
    session_of_result,
)
from ctxd.sessions._import import transcript_import
from ctxd.sessions._injection_methods import ack as inject_ack
from ctxd.sessions._injection_methods import list_queue as inject_list
from ctxd.sessions._injection_methods import pull as inject_pull
from ctxd.sessions._injection_methods import push as inject_push
from ctxd.sessions._injection_methods import session_of_injection
from ctxd.sessions._methods import (
    branch_status,
    compaction_key,
    session_close,
    session_delete,
    session_get,
    session_list,
    session_open,
    session_resume,
)
from ctxd.sessions._services import Services, SessionCounts
from ctxd.sessions._session_ops import (
    append,
    append_request,
    get_session,
    list_messages,
    measure,
    open_session,
    render,
    render_request,
)
from ctxd.sessions._state import SessionRecord, resolve_budget
from ctxd.sessions._supervisor import Supervisor
from ctxd.sessions._usage_tools import get_tool_call as tool_get
from ctxd.sessions._usage_tools import get_usage as usage_get
from ctxd.sessions._usage_tools import list_calls as tool_list
from ctxd.sessions._usage_tools import record_sent_usage
from ctxd.sessions._usage_tools import record_usage as usage_record
from ctxd.sessions._usage_tools import set_state as tool_state

__all__ = ["Search", "Services", "SessionActor", "SessionCounts", "SessionRecord", "Supervisor",
           "append", "append_request", "branch_status", "compact", "compaction_key",
           "context_fork", "create_branch",
           "get_session", "inject_ack", "inject_list", "inject_pull", "inject_push",
           "list_branches", "list_messages", "measure", "offered_tools", "open_session",
           "read_inside",
           "read_result",
           "record_sent_usage",
           "register_tools", "render", "render_request", "resolve_budget", "return_branch",
           "rollback",
           "search_tools", "session_close", "session_delete", "session_get", "session_list",
           "session_of_injection", "session_of_result", "session_open", "session_resume",
           "tool_get", "tool_list",
           "tool_state", "transcript_import", "usage_get", "usage_record"]
