/// Where a directory keeps its rows, as `--database` names it.
public enum DirectoryDatabase: Equatable, Sendable, CustomStringConvertible {
    /// `sqlite:PATH`: a file on this machine, the single-node default.
    case sqlite(path: String)

    /// `sqlite:PATH` (or a bare path ending in `.sqlite`/`.db`).
    public init(_ text: String) throws(DirectoryError) {
        if text.hasPrefix("sqlite:") {
            let path = String(text.dropFirst("sqlite:".count))
            guard !path.isEmpty else {
                throw DirectoryError("--database sqlite: needs a file, e.g. sqlite:/var/lib/tusa/directory.sqlite")
            }
            self = .sqlite(path: path)
        } else if text.hasPrefix("postgres://") || text.hasPrefix("postgresql://") {
            throw DirectoryError(
                "--database \(text): PostgreSQL is not supported yet (several directory nodes on one database come next); use sqlite:PATH"
            )
        } else if text.hasSuffix(".sqlite") || text.hasSuffix(".db") {
            self = .sqlite(path: text)
        } else {
            throw DirectoryError("--database must be sqlite:PATH, not '\(text)'")
        }
    }

    public var description: String {
        switch self {
        case .sqlite(let path): "sqlite:\(path)"
        }
    }
}

/// Why the directory's database cannot be used, in one line.
public struct DirectoryError: Error, Equatable, Sendable, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}
