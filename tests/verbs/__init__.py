"""The module's verbs and their Lua twins: replies, errors, effects, ACL, persistence, fuzzing."""
