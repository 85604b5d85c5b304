import Logging
import Relay

/// Where a directory keeps its rows, as `--database` names it.
public enum DirectoryDatabase: Equatable, Sendable, CustomStringConvertible {
    /// `sqlite:PATH`: a file on this machine, the single-node default.
    case sqlite(path: String)
    /// `postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE`: a PostgreSQL server.
    case postgres(PostgresLocation)

    /// `sqlite:PATH` (or a bare path ending in `.sqlite`/`.db`), or a `postgres://` URL.
    public init(_ text: String) throws(DirectoryError) {
        if text.hasPrefix("sqlite:") {
            let path = String(text.dropFirst("sqlite:".count))
            guard !path.isEmpty else {
                throw DirectoryError("--database sqlite: needs a file, e.g. sqlite:/var/lib/tusa/directory.sqlite")
            }
            self = .sqlite(path: path)
        } else if text.hasPrefix("postgres://") || text.hasPrefix("postgresql://") {
            self = .postgres(try PostgresLocation(url: text))
        } else if text.hasSuffix(".sqlite") || text.hasSuffix(".db") {
            self = .sqlite(path: text)
        } else {
            throw DirectoryError("--database must be sqlite:PATH or postgres://USER@HOST:PORT/DATABASE, not '\(text)'")
        }
    }

    public var description: String {
        switch self {
        case .sqlite(let path): "sqlite:\(path)"
        case .postgres(let location): location.description
        }
    }

    /// The schema version this build brings the database to.
    public var schemaVersion: Int {
        switch self {
        case .sqlite: SQLiteDirectoryStore.schemaVersion
        case .postgres: PostgresDirectoryStore.schemaVersion
        }
    }

    /// Opens (or makes) the database and brings its schema up to date.
    public func open(logger: Logger) async throws(DirectoryError) -> any RendezvousStore {
        switch self {
        case .sqlite(let path): try await SQLiteDirectoryStore.open(path: path, logger: logger)
        case .postgres(let location): try await PostgresDirectoryStore.open(location, logger: logger)
        }
    }
}

/// Why the directory's database cannot be used, in one line.
public struct DirectoryError: Error, Equatable, Sendable, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }

    /// A database whose schema a later tusa made (either store).
    static func newerSchema(in database: String, found: Int, known: Int) -> DirectoryError {
        DirectoryError("\(database) has schema version \(found), newer than this tusa's \(known): use a newer tusa")
    }

    /// A schema version below 0 (schema_migrations holds a row no tusa wrote).
    static func badSchema(in database: String, found: Int) -> DirectoryError {
        DirectoryError(
            "\(database) has schema version \(found) in schema_migrations, which no tusa writes: the table was changed by hand")
    }
}
