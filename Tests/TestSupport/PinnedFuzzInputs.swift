import Foundation

/// The inputs a fuzz target once crashed on, pinned as files in a test target's
/// `FuzzCrashes/` folder (its README aside), for a test to replay through the
/// target's checks.
public struct PinnedFuzzInputs: Sendable {
    public let folder: URL

    /// The `FuzzCrashes` folder beside the test file `filePath` (pass `#filePath`).
    public init(besideTestFile filePath: String) {
        folder = URL(fileURLWithPath: filePath).deletingLastPathComponent().appendingPathComponent("FuzzCrashes")
    }

    /// The pinned files' names, sorted (none when the folder is missing).
    public var names: [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: folder.path)) ?? []).filter { $0 != "README.md" }.sorted()
    }

    /// One pinned input's bytes.
    public func bytes(_ name: String) throws -> [UInt8] {
        Array(try Data(contentsOf: folder.appendingPathComponent(name)))
    }
}
