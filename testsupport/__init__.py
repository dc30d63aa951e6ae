"""Stand-ins that the tests and the benchmarks share: a scripted model server, real agent
servers started for a test or a benchmark, the studio's seeded chat.

Not part of the installed package: both import it from the repository's root (pytest puts
the root on the path; the benchmarks add it).
"""
