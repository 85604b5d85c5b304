import ArgumentParser

/// A time given in seconds on the command line (`--duration`, `--timeout`):
/// above 0, a number, and at most a year, so that it always makes a `Duration`
/// (`inf`, `nan` or `1e300` would not).
func seconds(_ value: Double, of option: String) throws -> Duration {
    let year = 366.0 * 86_400
    guard value > 0, value <= year else {
        throw ValidationError("\(option) must be a number of seconds above 0 and at most \(Int(year)) (a year), not \(value)")
    }
    return .milliseconds(Int64((value * 1000).rounded(.up)))
}
