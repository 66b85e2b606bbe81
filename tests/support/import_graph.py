"""Cycles in a directed graph (node -> the nodes it points to), for tests/test_dependencies.py's
import graph: one cycle per strongly connected component (iterative Tarjan, then the shortest path
back to its first node), and the nodes on some cycle through a node."""

from __future__ import annotations


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a path a -> ... -> a) per strongly connected component with more than one node."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0

    for root in sorted(edges):
        if root in index:
            continue
        # Iterative Tarjan, so deep graphs do not hit the recursion limit.
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))

    cycles = []
    for component in components:
        members = set(component)
        start = component[0]
        # Shortest path from start back to start inside the component.
        previous: dict[str, str] = {}
        frontier = [start]
        seen = {start}
        end = None
        while frontier and end is None:
            following = []
            for node in frontier:
                for child in sorted(edges[node] & members):
                    if child == start:
                        end = node
                        break
                    if child not in seen:
                        seen.add(child)
                        previous[child] = node
                        following.append(child)
                if end is not None:
                    break
            frontier = following
        path = [start]
        node = end
        while node != start:
            path.append(node)
            node = previous[node]
        path.append(start)
        cycles.append([start, *reversed(path[1:-1]), start] if len(path) > 2 else [start, start])
    return cycles


def component(edges: dict[str, set[str]], start: str) -> list[str]:
    """The nodes on some cycle through `start` (reachable from it and reaching it back)."""

    def reach(edges: dict[str, set[str]]) -> set[str]:
        seen, todo = {start}, [start]
        while todo:
            for child in edges.get(todo.pop(), ()):
                if child not in seen:
                    seen.add(child)
                    todo.append(child)
        return seen

    reverse: dict[str, set[str]] = {}
    for m, deps in edges.items():
        for d in deps:
            reverse.setdefault(d, set()).add(m)
    return sorted(reach(edges) & reach(reverse))
