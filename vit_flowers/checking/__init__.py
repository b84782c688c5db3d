"""What ``vit-flowers check`` finds in a folder of photos, before any training: duplicates, tiny photos, likely
wrong labels (photo_check), its page (check_report), its CSVs (check_files), and moving the photos they flag into a
quarantine and back (moves)."""
