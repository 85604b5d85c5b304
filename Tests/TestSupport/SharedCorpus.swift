import Foundation
import Testing

/// Locates `../shared/interop` beside the project. Tests that need it are
/// disabled with a clear message when it is absent.
public enum SharedCorpus {
    public static let root: URL = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("shared/interop")

    public static var isPresent: Bool { FileManager.default.fileExists(atPath: root.path) }
    public static let absentMessage: Comment = "../shared/interop is absent: shared interop corpus tests skipped"

    public static func files(_ folder: String) -> [URL] {
        let dir = root.appendingPathComponent(folder)
        let names = (try? FileManager.default.contentsOfDirectory(atPath: dir.path)) ?? []
        return names.sorted().map { dir.appendingPathComponent($0) }
    }

    public static func bytes(_ folder: String, _ name: String) throws -> [UInt8] {
        Array(try Data(contentsOf: root.appendingPathComponent(folder).appendingPathComponent(name)))
    }
}
