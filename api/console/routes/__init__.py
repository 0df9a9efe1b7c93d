"""The console's route handlers, a module a page as api.console.pages has them: the runs list, a run (its events,
artifacts and actions), work items, squad memory, starting a run. Each takes the request and the signed-in
`Session` (a POST's the form too), and, when it needs them, what they share (`context.Console`); api.console.app
puts them behind the guard and at their paths."""
