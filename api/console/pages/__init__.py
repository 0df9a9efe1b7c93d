"""The console's pages, rendered on the server from what the stack returns (api.console.html escapes all of it),
a module a page: the runs list, a run, work items, squad memory, starting a run, and the bare pages (sign-in, a
refusal), each in the layout of `layout`. Pages work without script; console.js only keeps them live (the runs
table, a run's events, countdowns)."""
