"""Types shared by every stage: recipe, manifest, document, errors. No stage logic lives here."""
