import Foundation

/// Locates `../shared/interop` beside the project. Tests that need it are
/// disabled with a clear message when it is absent.
enum SharedCorpus {
    static let root: URL = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("shared/interop")

    static var isPresent: Bool { FileManager.default.fileExists(atPath: root.path) }
    static let absentMessage: Comment = "../shared/interop is absent: shared interop corpus tests skipped"

    static func files(_ folder: String) -> [URL] {
        let dir = root.appendingPathComponent(folder)
        let names = (try? FileManager.default.contentsOfDirectory(atPath: dir.path)) ?? []
        return names.sorted().map { dir.appendingPathComponent($0) }
    }

    static func bytes(_ folder: String, _ name: String) throws -> [UInt8] {
        Array(try Data(contentsOf: root.appendingPathComponent(folder).appendingPathComponent(name)))
    }
}

import Testing
