"""An independent oracle for the graph tasks' tests: breadth-first search with shortest-path counting."""

import collections


def bfs(edges, start):
    """({node: distance from start}, {node: number of shortest paths from start}) over reachable nodes."""
    dist, count, queue = {start: 0}, collections.Counter({start: 1}), collections.deque([start])
    while queue:
        u = queue.popleft()
        for v in edges[u]:
            if v not in dist:
                dist[v] = dist[u] + 1
                queue.append(v)
            if dist[v] == dist[u] + 1:
                count[v] += count[u]
    return dist, count
