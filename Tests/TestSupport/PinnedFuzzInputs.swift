import Foundation

/// The inputs a fuzz target once crashed on, pinned as files in a test target's
/// `FuzzCrashes/` folder (its README aside), for a test to replay through the
/// target's checks; or, from another folder, the seeds a fuzz target starts from.
public struct PinnedFuzzInputs: Sendable {
    public let folder: URL

    /// The folder `name` (by default `FuzzCrashes`) beside the test file `filePath` (pass `#filePath`).
    public init(besideTestFile filePath: String, folder name: String = "FuzzCrashes") {
        folder = URL(fileURLWithPath: filePath).deletingLastPathComponent().appendingPathComponent(name)
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
