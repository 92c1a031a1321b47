"""The whole chapter in one launch. `plan` names the configurations and comparisons,
`rank` is the rank-side program (verify, time in alternating rounds, profile, compare) and
`verdicts` words the stability verdicts and the summary line."""
