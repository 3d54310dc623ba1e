"""The built-in agent flows of seed §8, one module per flow.

    inputs       §8.1, §8.2  acceptance, queues, placement, input results (no task)
    generation   §8.3        ``generation``: one model request of an input group
    tool         §8.4        ``tool``: one call, and the outside answers to a held call
    approval     §8.6        ``approval``: a held call's decision, a durable task
    join         §8.4        ``post_tools``: the join after one assistant entry's calls
    collapse     §8.5        ``collapse``: a summary published in place of a prefix
    subagent     §8.6        ``subagent``: the owner S of a child conversation (spawn)
    owner                    a child's terminal boundary settling its owner S
    streaming                the provider stream shared by generation and collapse
    common                   ``AgentServices`` and the task-state readers every flow uses

Each task-definition module starts with its statuses -> roles table and transitions.
"""

from __future__ import annotations

from pico.application.flows.approval import ApprovalDefinition
from pico.application.flows.collapse import CollapseDefinition
from pico.application.flows.common import AgentServices
from pico.application.flows.generation import GenerationDefinition
from pico.application.flows.inputs import InputResult
from pico.application.flows.join import PostToolsDefinition
from pico.application.flows.subagent import SubagentDefinition
from pico.application.flows.tool import ToolCallAnsweredError, ToolTaskDefinition
from pico.application.tasks import TaskDefinition

__all__ = ["AgentServices", "InputResult", "ToolCallAnsweredError", "agent_definitions"]


def agent_definitions(services: AgentServices) -> list[TaskDefinition]:
    """The task definitions of the built-in flows, registered by a harness opened with a
    model provider."""
    return [
        ApprovalDefinition(),
        CollapseDefinition(services),
        GenerationDefinition(services),
        ToolTaskDefinition(services),
        PostToolsDefinition(services),
        SubagentDefinition(services),
    ]
