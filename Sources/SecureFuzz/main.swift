// Placeholder until the media/control fuzz checks land (next commit).
print("SecureFuzz: no checks yet")
