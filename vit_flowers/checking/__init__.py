"""What ``vit-flowers check`` finds in a folder of photos, before any training: duplicates, tiny photos, likely
wrong labels (photo_check), and its page (check_report)."""
