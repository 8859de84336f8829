"""A verl function tool, loaded by verl's own ``function_tool_path`` mechanism in the agent-loop
tests (``load_function_tools_from_path`` executes this file; it is not a test module)."""

from verl.tools.function_tool import function_tool


@function_tool
def calc(a: int) -> str:
    """Add three to a number.

    Args:
        a: the number to add three to
    """
    return str(a + 3)
